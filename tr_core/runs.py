"""A run as data: a header, the Step records, the baseline's progress, both outputs, token texts.

Every panel of the app draws from Step records alone, so a run file opened later, on a machine
with no model, replays with all panels.  The file is JSON (never pickle), versioned, and validated
on read: ``read_run`` refuses anything that is not a run of this format with a ``RunFileError``.

Layout (``FORMAT`` = "token-recycling-run", ``VERSION`` = 1)::

    {"format", "version",
     "header": {"model", "dtype", "device", "machine", "template", "method", "settings": {...}, "prompt",
                "prompt_ids"},  # machine: the CPU's model, ISA and cores, or the GPU's name (files without it still read)
     "steps": [Step.to_dict(), ...],
     "baseline": [{"tokens", "forwards", "seconds", "reading", "alongside"} after each step],  # greedy's progress in the race
                                  # (seconds: its steps', reading the prompt included, which was "reading" of them)
     "outputs": {"method": [...ids], "baseline": [...ids]},
     "tokens": {"id": "text", ...}, "special": [ids shown as a marked end]}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .devices import name_machine
from .precision import BUG, NEAR_TIE, Divergence
from .race import Race
from .trace import DraftTree, RowUpdate, Step

FORMAT = "token-recycling-run"
VERSION = 1
MAX_BYTES = 32 * 1024 * 1024  # a 256-token paper-80 run is about 3 MB
MAX_STEPS = 4096
MAX_TREE_NODES = 1024  # per step: the largest tree (512 nodes) plus lookup and PTD's draft nodes, with room


class RunFileError(ValueError):
    """Not a run file of this format; the message says why, in words."""


@dataclass
class Run:
    header: dict
    steps: list[Step]
    baseline: list[dict]  # greedy's tokens, forwards, seconds after each step of the method
    outputs: dict[str, list[int]]
    tokens: dict[int, str] = field(default_factory=dict)
    special: set[int] = field(default_factory=set)

    def token_text(self, token_id: int) -> str:
        return self.tokens.get(int(token_id), f"<{token_id}>")

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "header": self.header,
                "steps": [s.to_dict() for s in self.steps], "baseline": self.baseline,
                "outputs": self.outputs, "tokens": {str(k): v for k, v in sorted(self.tokens.items())},
                "special": sorted(self.special)}


def step_token_ids(steps: list[Step]) -> set[int]:
    """Every token id a Step mentions (tree, choices, committed, rows, PTD's draft tree)."""
    ids: set[int] = set()
    for s in steps:
        ids.update(s.tree.tokens, s.committed, s.model_choices)
        for r in s.rows_written:
            ids.add(r.token)
            ids.update(r.old)
            ids.update(r.new)
        if s.draft_tree is not None:
            ids.update(s.draft_tree.tokens)
    return ids


def make_run(header: dict, steps: list[Step], baseline: list[dict], outputs: dict[str, list[int]],
             token_text, special_ids) -> Run:
    """A run with the texts of every token it mentions (``token_text(id) -> str``)."""
    ids = step_token_ids(steps) | {t for out in outputs.values() for t in out}
    ids |= set(header.get("prompt_ids") or [])
    return Run(dict(header), list(steps), list(baseline), {k: list(v) for k, v in outputs.items()},
               {i: token_text(i) for i in sorted(ids)}, set(special_ids) & ids)


def write_run(run: Run, path) -> None:
    from pathlib import Path

    Path(path).write_text(json.dumps(run.to_dict(), ensure_ascii=False, separators=(",", ":")))


def read_run(data: bytes | str) -> Run:
    """Parse and validate the bytes of a run file (never a path)."""
    if len(data) > MAX_BYTES:
        raise RunFileError(f"The file is {len(data) / 1e6:.1f} MB; a run file is at most {MAX_BYTES // 2**20} MB.")
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunFileError(f"This is not a run file (not JSON: {err}).") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RunFileError("This is not a run file of Token Recycling (no 'format': 'token-recycling-run').")
    if doc.get("version") != VERSION:
        raise RunFileError(f"Run file version {doc.get('version')!r} is not supported (this app reads {VERSION}).")
    try:
        return _run_from_doc(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise RunFileError(f"The run file is damaged or incomplete ({type(err).__name__}: {err}).") from None


def _run_from_doc(doc: dict) -> Run:
    header = doc["header"]
    _need(isinstance(header, dict) and isinstance(header.get("prompt", ""), str), "header")
    _need(all(isinstance(header.get(k, ""), str)
              for k in ("model", "dtype", "device", "machine", "template", "method"))
          and isinstance(header.get("settings", {}), dict), "header fields")
    if header.get("divergence") is not None:
        header["divergence"] = _divergence(header["divergence"])
    raw_steps = doc["steps"]
    _need(isinstance(raw_steps, list) and 0 < len(raw_steps) <= MAX_STEPS, "steps")
    steps = [step_from_dict(s, n + 1) for n, s in enumerate(raw_steps)]
    baseline = [{"tokens": int(b["tokens"]), "forwards": int(b["forwards"]), "seconds": float(b["seconds"]),
                 "reading": float(b.get("reading", 0.0)), "alongside": int(b.get("alongside", 0))} for b in doc["baseline"]]
    _need(len(baseline) == len(steps), "baseline")
    outputs = {str(k): _ints(v) for k, v in doc["outputs"].items()}
    tokens = {int(k): str(v) for k, v in doc["tokens"].items()}
    special = set(_ints(doc.get("special", [])))
    return Run(header, steps, baseline, outputs, tokens, special)


def step_from_dict(d: dict, index: int) -> Step:
    """A Step from ``Step.to_dict()``, checked for the invariants the panels rely on."""
    tree = _tree(d["tree"])
    _need(len(tree.tokens) >= 1, "tree")
    path = _ints(d["accepted_path"])
    _need(path and path[0] == 0 and all(0 <= i < len(tree.tokens) for i in path), "accepted_path")
    choices = _ints(d["model_choices"])
    _need(len(choices) >= len(path) or not d["committed"], "model_choices")
    rows = [RowUpdate(int(r["token"]), _ints(r["old"]), _ints(r["new"])) for r in d["rows_written"]]
    _need(all(len(r.old) == len(r.new) for r in rows), "rows_written")
    timings = {str(k): float(v) for k, v in d["timings"].items()}
    draft = _tree(d["draft_tree"]) if d.get("draft_tree") else None
    _need(int(d["index"]) == index, "index")
    _need(int(d.get("blank_drafts", 0)) >= 0, "blank_drafts")
    _need(int(d.get("alongside", 0)) >= 0, "alongside")
    under = _ints(d.get("blank_under", []))
    _need(all(0 <= i < len(tree.tokens) for i in under), "blank_under")
    return Step(index, str(d["method"]), tree, path, _ints(d["committed"]), choices, rows,
                int(d["forward_tokens"]), int(d["cache_length"]), timings, bool(d.get("done", False)),
                bool(d.get("sampled", False)), draft, blank_drafts=int(d.get("blank_drafts", 0)), blank_under=under,
                wall=None if d.get("wall") is None else float(d["wall"]), alongside=int(d.get("alongside", 0)))


def _divergence(d: dict) -> dict:
    """The header's explanation of the first divergence, rebuilt field by field with their types."""
    token = d["method_token"]
    div = Divergence(int(d["position"]), int(d["greedy_token"]), None if token is None else int(token),
                     float(d["margin"]), float(d["bound"]), str(d["cause"]), str(d["dtype"]),
                     None if d.get("forward_tokens") is None else int(d["forward_tokens"]))
    _need(div.position >= 0 and div.cause in (NEAR_TIE, BUG), "divergence")
    return div.to_json()


def _tree(d: dict) -> DraftTree:
    t = DraftTree(_ints(d["tokens"]), _ints(d["parents"]), _ints(d["depths"]), _ints(d["ranks"]),
                  [str(s) for s in d.get("sources", [])])
    n = len(t.tokens)
    _need(n <= MAX_TREE_NODES, "tree size")
    _need(len(t.parents) == len(t.depths) == n and len(t.ranks) in (0, n), "tree lengths")
    _need(all(p < i for i, p in enumerate(t.parents)) and (n == 0 or t.parents[0] == -1), "tree parents")
    _need(not t.sources or len(t.sources) == n, "tree sources")
    return t


def _ints(v) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ValueError("expected a list of integers")
    return list(v)


def _need(ok, what: str) -> None:
    if not ok:
        raise ValueError(f"bad {what}")


def run_header(lm, method: str, settings: dict, prompt: str, prompt_ids: list[int]) -> dict:
    """What a run file says about where it was recorded (see the module doc)."""
    return {"model": lm.name, "dtype": str(lm.dtype).replace("torch.", ""), "device": str(lm.device),
            "machine": name_machine(lm.device), "template": lm.template, "attention": lm.layout.describe(),
            "method": method, "settings": settings, "prompt": prompt, "prompt_ids": list(prompt_ids)}


def special_ids(lm) -> set[int]:
    """The tokens shown as a marked end rather than as text: the tokenizer's special ones and EOS."""
    return set(getattr(lm.tokenizer, "all_special_ids", []) or []) | set(lm.eos_token_ids)


def record_run(lm, prompt: str, decoder, greedy, settings: dict | None = None) -> Run:
    """Run ``decoder`` to the end on ``prompt`` with ``greedy`` catching up after each step, as the app's
    race does (``tr_core.race``), and return the run (header, steps, greedy's progress, both outputs, token texts)."""
    ids = lm.encode_prompt(prompt)
    race = Race(decoder, greedy)
    race.start(ids)
    while not race.done:
        race.step()
    header = run_header(lm, decoder.method, dict(settings or {}), prompt, ids)
    if race.divergence is not None:
        header["divergence"] = race.divergence.to_json()
    return make_run(header, decoder.steps, race.baseline, {"method": decoder.output, "baseline": greedy.output},
                    lm.token_text, special_ids(lm))


def save_runs(folder, lm, prompts, specs, max_new_tokens: int) -> list[str]:
    """``python -m tr_core.bench ... --save-runs DIR``: one run file per prompt and method (the
    bench's ``MethodSpec``s with step decoders; the greedy baselines are not saved), named by question
    and method."""
    from pathlib import Path

    from .decoders import Decoder, GreedyDecoder

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for p in prompts:
        for spec in specs:
            decoder = spec.make(lm, max_new_tokens)
            if not isinstance(decoder, Decoder) or isinstance(decoder, GreedyDecoder):
                continue  # the baselines (greedy, its A/A copy) and generate()-based peers have no steps
            run = record_run(lm, p.text, decoder, GreedyDecoder(lm, max_new_tokens),
                             {"method": spec.name, "tree": getattr(spec, "tree", None) or "",
                              "max_new_tokens": max_new_tokens})
            path = out / f"{p.question_id}-{spec.name}.json".replace("/", "_")
            write_run(run, path)
            written.append(str(path))
    return written
