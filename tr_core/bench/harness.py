"""Run decoders side by side on the same tokenised prompts and time them fairly."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable


from ..decoders import Additions, GreedyDecoder, ProgressiveTreeDecoder, PromptLookupDecoder, TokenRecyclingDecoder
from ..decoders.base import Decoder
from ..matrix import AdjacencyMatrix
from ..cost import cost_curve_for
from ..devices import synchronize
from ..models import LoadedModel
from ..planner import TreePlanner
from ..precision import explain_divergence, first_difference
from ..progressive import PTDConfig, PTDPlanner
from ..sampling import SamplingConfig
from .data import BenchPrompt
from .peers import HFGenerate, HFPromptLookup


@dataclass
class MethodSpec:
    """A named way to build a decoder; ``make(lm, max_new_tokens)`` is called once per prompt."""

    name: str
    make: Callable[[LoadedModel, int], Decoder]
    tree: str = ""
    reset: Callable[[], None] = lambda: None  # forget what was learnt (after the warm-up)


@dataclass
class TimedRun:
    """One method's timed decode of one prompt (one turn), and how its output compares with greedy's."""

    method: str
    question_id: str
    category: str
    new_tokens: int
    seconds: float
    steps: int
    identical: bool | None  # None: not compared (sampling)
    first_mismatch: int | None = None
    forward_tokens: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    turn: int = 1
    divergence: dict | None = None  # why the output left greedy's (tr_core.precision.Divergence)
    place: int = 0  # where in the prompt's method order it ran (0: first)


def _tr_spec(name: str, lm: LoadedModel, tree: str | None, k: int, lookup: int | None,
             sampling: SamplingConfig | None = None, uniform: bool = False, paper: bool = False,
             budget: int | None = None, matrix_file: str | None = None) -> MethodSpec:
    """``tr`` (the device default), ``tr:TREE`` (``paper``: the paper's method exactly on TREE),
    ``tr:TREE+pldN`` (TREE with our drafting and N tokens retrieved from the context) or ``tr:bestN``
    (``budget``: the best N draft nodes a step, tree and retrieval together, a GPU's fixed budget);
    ``uniform``: the auto tree's planner starts from no learnt priors (``tr:uniform``, the ablation).
    ``matrix_file``: every prompt starts from this matrix (as the app's hot start does), else the
    matrix carries over from prompt to prompt, from empty."""
    def start_matrix() -> AdjacencyMatrix:
        if matrix_file is None:
            return AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)
        return AdjacencyMatrix.load(matrix_file, lm.fingerprint, lm.vocab_size, lm.device).narrowed(k)
    matrix = start_matrix()  # hot start across prompts
    planner = TreePlanner(lm, k=k, uniform_prior=uniform, budget=budget) if uniform or budget else None
    additions = Additions.none() if paper else Additions(node_budget=budget, **({} if lookup is None else {"lookup": lookup}))
    probe = TokenRecyclingDecoder(lm, tree="auto" if uniform else tree, matrix=matrix, planner=planner, additions=additions)
    lookup, planner = probe.lookup, probe.planner
    extra = " (the paper's method)" if paper else (f" + retrieval {lookup}" if lookup else "")
    shape = "auto" if planner is not None else probe.tree
    label = (f"the best {budget} draft nodes a step, of paper-80's and the retrieval's" if budget else
             f"auto (cost-aware, from paper-80{', uniform priors' if uniform else ''})" if planner else
             f"{probe.tree.name} ({probe.tree.size} nodes)")

    def reset() -> None:
        matrix.reset()
        if planner is not None:
            planner.reset()

    def make(lm_: LoadedModel, n: int) -> TokenRecyclingDecoder:
        if matrix_file is not None:  # each prompt from the file's matrix, its planner afresh (a new tab's start)
            reset()
            fresh = start_matrix()
            matrix.table.copy_(fresh.table)
            matrix.pairs = fresh.pairs
        return TokenRecyclingDecoder(lm_, tree=shape, matrix=matrix, planner=planner, max_new_tokens=n,
                                     trace_rows=False, sampling=sampling, additions=additions)
    start = f", each prompt from {matrix_file}" if matrix_file else ""
    return MethodSpec(name, make, tree=label + extra + start, reset=reset)


def _ptd_spec(name: str, arg: str, lm: LoadedModel, sampling: SamplingConfig | None = None) -> MethodSpec:
    """``ptd`` (the default: cost-aware on every device), ``ptd:paper`` (the paper's
    settings) or ``ptd:TxD`` (at most T candidates and D draft nodes a step, fixed)."""
    config = PTDConfig.default() if not arg else PTDConfig.paper()
    if arg and arg != "paper":
        try:
            config.trie_nodes, config.max_nodes = (int(x) for x in arg.split("x"))
        except ValueError:
            raise ValueError(f"Bad method {name!r}: use ptd, ptd:paper or ptd:TxD with two numbers, e.g. "
                             "ptd:16x16.") from None
    planner = PTDPlanner(cost_curve_for(lm), config.max_nodes) if config.cost_aware else None
    label = (f"cost-aware, trie<={config.trie_nodes}, draft<={config.max_nodes} (what pays)" if planner else
             f"trie<={config.trie_nodes}, draft<={config.max_nodes}") + f", width {config.width}, depth {config.depth}"
    return MethodSpec(name, lambda lm_, n: ProgressiveTreeDecoder(lm_, n, config, sampling, planner), tree=label,
                      reset=planner.reset if planner is not None else (lambda: None))


def peer_model(plain: LoadedModel | None) -> str:
    """Which model the ``hf-*`` peers run on, for the report."""
    return "untouched model" if plain is not None else "the same model as ours (our kernels)"


AA_SUFFIX = "-aa"  # the baseline's second copy: the A/A row
PLAIN_DECODERS = ("greedy", "sample", "greedy" + AA_SUFFIX, "sample" + AA_SUFFIX, "hf-greedy")  # baseline_specs'


def baseline_specs(lm: LoadedModel, plain: LoadedModel | None, sampling: SamplingConfig | None) -> list[MethodSpec]:
    """The plain decoders every report carries: ours (greedy, or ``sample`` when sampling), its
    second copy (the A/A row: any gap between the two is timing noise), and, for greedy, ``hf-greedy``
    (``generate(do_sample=False)`` on ``plain``, the model as transformers loads it)."""
    base = "greedy" if sampling is None else "sample"
    specs = [MethodSpec(name, lambda lm_, n: GreedyDecoder(lm_, n, sampling)) for name in (base, base + AA_SUFFIX)]
    if sampling is None:
        specs.append(MethodSpec("hf-greedy", lambda lm_, n: HFGenerate(plain or lm_, n),
                                tree=f"generate(do_sample=False), {peer_model(plain)}"))
    return specs


def parse_methods(text: str, lm: LoadedModel, tree: str | None = None, k: int = 8,
                  lookup: int | None = None, sampling: SamplingConfig | None = None,
                  plain: LoadedModel | None = None, matrix_file: str | None = None) -> list[MethodSpec]:
    """``greedy,tr,tr:paper-80,tr:tr-16+pld10`` -> specs, after the baselines (:func:`baseline_specs`),
    with the same sampling settings for all.  ``plain``: the untouched copy of the model the ``hf-*``
    peers run on (default: ``lm`` itself)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"Method(s) named twice: {', '.join(repeated)}; each method runs once per prompt.")
    specs = baseline_specs(lm, plain, sampling)
    for name in names:
        base, _, arg = name.partition(":")
        if arg and base in (*PLAIN_DECODERS, "pld"):
            raise ValueError(f"Bad method {name!r}: {base} takes no setting after ':'.")
        if base in PLAIN_DECODERS:  # they run anyway (baseline_specs)
            continue
        if base == "pld":
            specs.append(MethodSpec("pld", lambda lm_, n: PromptLookupDecoder(lm_, n, sampling=sampling),
                                    tree="3..1-gram, 10 drafts"))
            continue
        if base == "hf-pld" and arg in ("", "same"):
            on = None if arg else plain  # hf-pld:same: on our model, whatever --peers says (same kernels as ours)
            specs.append(MethodSpec(name, lambda lm_, n, on=on: HFPromptLookup(on or lm_, n, sampling=sampling),
                                    tree=f"generate(prompt_lookup=10), {peer_model(on)}"))
            continue
        if base == "ptd":
            specs.append(_ptd_spec(name, arg, lm, sampling))
            continue
        if base == "tr" and arg in ("", "uniform"):
            specs.append(_tr_spec(name, lm, tree, k, lookup, sampling, uniform=arg == "uniform",
                                  matrix_file=matrix_file))
        elif base == "tr" and arg.startswith("best"):
            try:
                budget = int(arg[4:])
            except ValueError:
                raise ValueError(f"Bad method {name!r}: use tr:bestN with N a number of draft nodes.") from None
            if budget < 1:
                raise ValueError(f"Bad method {name!r}: the budget must be at least 1 draft node.")
            specs.append(_tr_spec(name, lm, "auto", k, lookup, sampling, budget=budget))
        elif base == "tr":
            shape, _, pld = arg.partition("+pld")
            try:
                n = int(pld) if pld else 0
            except ValueError:
                raise ValueError(f"Bad method {name!r}: use tr:TREE+pldN with N a number.") from None
            specs.append(_tr_spec(name, lm, shape, k, n, sampling, paper=not pld))
        else:
            raise ValueError(f"Unknown method {name!r}; known: greedy, hf-greedy, tr, tr:uniform, tr:TREE, tr:TREE+pldN, tr:bestN, pld, hf-pld, hf-pld:same, ptd, ptd:paper, ptd:TxD.")
    return specs


def _explain(lm: LoadedModel, ids: list[int], reference: list[int], dec, out: list[int]) -> dict:
    """The first divergence from greedy, with its margin and cause, and the forward size of the
    method's step that committed that position (None for peers without steps)."""
    pos, size, done = first_difference(reference, out), None, 0
    for s in getattr(dec, "steps", []):
        done += len(s.committed)
        if done > pos:
            size = s.forward_tokens
            break
    div = explain_divergence(lm, ids, reference, out, size)
    return div.to_json() if div is not None else {}  # None: the reference stopped first


def _timed_generate(dec, ids: list[int]) -> tuple[list[int], float]:
    sync = lambda: synchronize(dec.lm.device)  # noqa: E731
    sync()
    t0 = time.perf_counter()
    out = dec.generate(ids)
    sync()
    return list(out), time.perf_counter() - t0


def williams_orders(m: int) -> list[list[int]]:
    """A balanced Latin square (Williams design) for ``m`` methods: every method takes every place
    equally often, and every method directly follows every other equally often (``m`` rows for even
    ``m``; for odd ``m`` the rows and their mirror images, ``2m``).  Caches, clocks and turbo that
    favour a place or a predecessor then favour no method."""
    if m <= 1:
        return [list(range(m))]
    first, lo, hi = [0], 1, m - 1
    while len(first) < m:
        first.append(lo)
        lo += 1
        if len(first) < m:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % m for x in first] for r in range(m)]
    return rows if m % 2 == 0 else rows + [row[::-1] for row in rows]


def rotated(specs: list[MethodSpec], n: int) -> list[MethodSpec]:
    """The method order for the ``n``-th prompt: row ``n`` of a Williams design (:func:`williams_orders`),
    so over each full cycle of prompts every method runs in every place and after every other
    method equally often."""
    rows = williams_orders(len(specs))
    return [specs[i] for i in rows[n % len(rows)]]


def warm_up(lm: LoadedModel, prompts: list[BenchPrompt], specs: list[MethodSpec], max_new_tokens: int) -> None:
    """Every method on the first prompts, untimed (kernels, allocator, caches); then forget what was learnt."""
    for p in prompts:
        ids = lm.encode_prompt(p.text)
        for spec in specs:
            spec.make(lm, min(16, max_new_tokens)).generate(ids)
    for spec in specs:
        spec.reset()


def run_turn(lm: LoadedModel, prompt: BenchPrompt, turn: int, ids: list[int], specs: list[MethodSpec],
             max_new_tokens: int, compare: bool) -> tuple[list[TimedRun], list[int]]:
    """Every method of ``specs`` once on ``ids``, in that order; outputs compared with the baseline's
    (``greedy``, else ``sample``, else the first spec's).  Returns the runs and the baseline's output."""
    outputs, decoders, runs = {}, {}, []
    for place, spec in enumerate(specs):
        dec = spec.make(lm, max_new_tokens)
        out, secs = _timed_generate(dec, ids)
        outputs[spec.name], decoders[spec.name] = out, dec
        phases: dict[str, float] = {}
        for s in dec.steps:
            for k, v in s.timings.items():
                phases[k] = phases.get(k, 0.0) + v
        runs.append(TimedRun(spec.name, prompt.question_id, prompt.category, len(out), secs, len(dec.steps), None,
                        None, sum(s.forward_tokens for s in dec.steps), phases, turn, place=place))
    reference = next((outputs[b] for b in BASELINES if b in outputs), outputs[specs[0].name])
    for r in runs:
        if compare:
            r.first_mismatch = first_difference(reference, outputs[r.method])
            r.identical = r.first_mismatch is None
            if not r.identical:
                r.divergence = _explain(lm, ids, reference, decoders[r.method], outputs[r.method])
    return runs, reference


BASELINES = ("greedy", "sample")


def run_benchmark(lm: LoadedModel, prompts: list[BenchPrompt], specs: list[MethodSpec], max_new_tokens: int,
                  warmup: int = 1, progress: bool = True, turns: int = 1, compare: bool = True) -> list[TimedRun]:
    """All methods on each prompt, prompt by prompt, the order changing from prompt to prompt
    (a Williams design, :func:`rotated`).

    ``compare``: check every output against the baseline's (greedy decoding is lossless); off when
    sampling, where outputs differ by design and only their distribution is the same.

    ``turns`` = 2 also runs a question's second turn (MT-bench), after its first turn and the
    baseline's answer to it, so every method sees the same conversation.
    """
    warm_up(lm, prompts[:warmup], specs, max_new_tokens)
    runs: list[TimedRun] = []
    iterator = prompts
    try:
        from tqdm import tqdm
        iterator = tqdm(prompts, desc="prompts", disable=not progress, file=sys.stderr)
    except ImportError:
        pass
    for n, prompt in enumerate(iterator):
        questions = list(prompt.turns or (prompt.text,))[:max(1, turns)]
        answers: list[str] = []
        for turn in range(len(questions)):
            ids = lm.encode_conversation(questions[:turn + 1], answers)
            done, reference = run_turn(lm, prompt, turn + 1, ids, rotated(specs, n), max_new_tokens, compare)
            runs += sorted(done, key=lambda r: [s.name for s in specs].index(r.method))
            answers.append(lm.tokenizer.decode(reference, skip_special_tokens=True))
    return runs
