"""Run decoders side by side on the same tokenised prompts and time them fairly."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..decoders import GreedyDecoder, ProgressiveTreeDecoder, PromptLookupDecoder, TokenRecyclingDecoder
from ..decoders.base import Decoder
from ..matrix import AdjacencyMatrix
from ..models import LoadedModel, synchronize
from ..precision import explain_divergence, first_difference
from ..ptd import PTDConfig
from ..sampling import SamplingConfig
from .data import BenchPrompt
from .peers import HFPromptLookup


@dataclass
class MethodSpec:
    """A named way to build a decoder; ``make(lm, max_new_tokens)`` is called once per prompt."""

    name: str
    make: Callable[[LoadedModel, int], Decoder]
    tree: str = ""
    reset: Callable[[], None] = lambda: None  # forget what was learnt (after the warm-up)


@dataclass
class Run:
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


def _tr_spec(name: str, lm: LoadedModel, tree: str | None, k: int, lookup: int | None,
             sampling: SamplingConfig | None = None) -> MethodSpec:
    """``tr`` (the device default), ``tr:TREE`` (the paper's method on TREE) or ``tr:TREE+pldN``."""
    matrix = AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)  # hot start across prompts
    probe = TokenRecyclingDecoder(lm, tree=tree, matrix=matrix, lookup=lookup)
    lookup, planner = probe.lookup, probe.planner
    extra = f" + lookup {lookup}" if lookup else ""
    shape = "auto" if planner is not None else probe.tree

    def reset() -> None:
        matrix.reset()
        if planner is not None:
            planner.reset()
    return MethodSpec(name, lambda lm_, n: TokenRecyclingDecoder(lm_, tree=shape, matrix=matrix, lookup=lookup,
                                                                 planner=planner, max_new_tokens=n,
                                                                 trace_rows=False, sampling=sampling),
                      tree=("auto (cost-aware, from paper-80)" if planner else
                            f"{probe.tree.name} ({probe.tree.size} nodes)") + extra, reset=reset)


def _ptd_spec(name: str, arg: str, sampling: SamplingConfig | None = None) -> MethodSpec:
    """``ptd`` (the paper's defaults) or ``ptd:TxD`` (at most T candidates and D draft nodes a step)."""
    config = PTDConfig()
    if arg:
        try:
            config.trie_nodes, config.max_nodes = (int(x) for x in arg.split("x"))
        except ValueError:
            raise ValueError(f"Bad method {name!r}: use ptd:TxD with two numbers, e.g. ptd:16x16.") from None
    label = f"trie<={config.trie_nodes}, draft<={config.max_nodes}, width {config.width}, depth {config.depth}"
    return MethodSpec(name, lambda lm_, n: ProgressiveTreeDecoder(lm_, n, config, sampling), tree=label)


def parse_methods(text: str, lm: LoadedModel, tree: str | None = None, k: int = 8,
                  lookup: int | None = None, sampling: SamplingConfig | None = None) -> list[MethodSpec]:
    """``greedy,tr,tr:paper-80,tr:tr-16+pld10`` -> specs; the baseline is always included and first:
    greedy, or plain sampling (``sample``) when ``sampling`` is given, with the same settings for all."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    base_name = "greedy" if sampling is None else "sample"
    specs = [MethodSpec(base_name, lambda lm_, n: GreedyDecoder(lm_, n, sampling))]
    for name in names:
        base, _, arg = name.partition(":")
        if base in ("greedy", "sample"):
            continue
        if base == "pld":
            specs.append(MethodSpec("pld", lambda lm_, n: PromptLookupDecoder(lm_, n, sampling=sampling),
                                    tree="3..1-gram, 10 drafts"))
            continue
        if base == "hf-pld":
            specs.append(MethodSpec("hf-pld", lambda lm_, n: HFPromptLookup(lm_, n, sampling=sampling),
                                    tree="generate(prompt_lookup=10)"))
            continue
        if base == "ptd":
            specs.append(_ptd_spec(name, arg, sampling))
            continue
        if base == "tr" and not arg:
            specs.append(_tr_spec(name, lm, tree, k, lookup, sampling))
        elif base == "tr":
            shape, _, pld = arg.partition("+pld")
            try:
                n = int(pld) if pld else 0
            except ValueError:
                raise ValueError(f"Bad method {name!r}: use tr:TREE+pldN with N a number.") from None
            specs.append(_tr_spec(name, lm, shape, k, n, sampling))
        else:
            raise ValueError(f"Unknown method {name!r}; known: greedy, tr, tr:TREE, tr:TREE+pldN, pld, hf-pld, ptd, ptd:TxD.")
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
    return explain_divergence(lm, ids, reference, out, size).to_json()


def _timed_generate(dec, ids: list[int]) -> tuple[list[int], float]:
    sync = lambda: synchronize(dec.lm.device)  # noqa: E731
    sync()
    t0 = time.perf_counter()
    out = dec.generate(ids)
    sync()
    return list(out), time.perf_counter() - t0


def run_benchmark(lm: LoadedModel, prompts: list[BenchPrompt], specs: list[MethodSpec], max_new_tokens: int,
                  warmup: int = 1, progress: bool = True, turns: int = 1, compare: bool = True) -> list[Run]:
    """Methods run one after another on each prompt (greedy first), prompt by prompt.

    ``compare``: check every output against the first method's (greedy decoding is lossless);
    off when sampling, where outputs differ by design and only their distribution is the same.

    ``turns`` = 2 also runs a question's second turn (MT-bench), after its first turn and greedy's
    answer to it, so every method sees the same conversation.
    """
    for p in prompts[:warmup]:  # warm-up: kernels, allocator, caches; not timed, matrices reset after
        ids = lm.encode_prompt(p.text)
        for spec in specs:
            spec.make(lm, min(16, max_new_tokens)).generate(ids)
    for spec in specs:
        spec.reset()
    runs: list[Run] = []
    iterator = prompts
    try:
        from tqdm import tqdm
        iterator = tqdm(prompts, desc="prompts", disable=not progress, file=sys.stderr)
    except ImportError:
        pass
    for prompt in iterator:
        questions = list(prompt.turns or (prompt.text,))[:max(1, turns)]
        answers: list[str] = []
        for turn in range(len(questions)):
            ids = lm.encode_conversation(questions[:turn + 1], answers)
            reference = None
            for spec in specs:
                dec = spec.make(lm, max_new_tokens)
                out, secs = _timed_generate(dec, ids)
                if reference is None:
                    reference = out
                mismatch = first_difference(reference, out) if compare else None
                phases: dict[str, float] = {}
                for s in dec.steps:
                    for k, v in s.timings.items():
                        phases[k] = phases.get(k, 0.0) + v
                runs.append(Run(spec.name, prompt.question_id, prompt.category, len(out), secs, len(dec.steps),
                                (mismatch is None) if compare else None, mismatch, sum(s.forward_tokens for s in dec.steps), phases,
                                turn + 1, _explain(lm, ids, reference, dec, out) if mismatch is not None else None))
            answers.append(lm.tokenizer.decode(reference, skip_special_tokens=True))
    return runs
