"""A class on one server, measured: N sequences decoded together, every round's steps in one forward.

``python -m tr_core.bench --prompts FILE --concurrency 1,4,8,16`` decodes, at each N, the file's
prompts N at a time, each slot a tab of its own (its own decoder, KV cache, matrix and planner) that
takes the next prompt when its sequence ends, in rounds: every sequence's step is prepared, the
round's requests run as one forward (:func:`tr_core.batching.run_forwards`), and each sequence
verifies its own.  The clock runs the rounds while all N slots are busy (until 2 N sequences are
done), so a figure is a class's steady decoding, not the tail of its slowest sequence; reading the
prompts (the same for every method) is left out.  Token Recycling
and greedy run this way at the same N, interleaved (their order rotates with each repeat), with a
second greedy (the A/A row: any gap between the two greedy rows is timing noise).  It prints the total
tokens per second, each sequence's tokens per second (median) and TR's speedup at each N, with the
tree size TR's planners chose and the tokens each sequence got per forward (MAT).  TR's outputs are
checked against both greedy rows' for the same prompts.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from ..batching import run_forwards
from ..decoders import Decoder, GreedyDecoder, TokenRecyclingDecoder
from ..devices import synchronize
from ..matrix import AdjacencyMatrix
from ..models import LoadedModel
from ..planner import TreePlanner

METHODS = ("greedy", "tr", "greedy-aa")


@dataclass
class ClassRun:
    """One method's decode with ``n`` sequences in flight, until ``jobs`` sequences were done."""

    method: str
    n: int
    seconds: float
    outputs: dict[int, list[int]]  # job -> its tokens (the last ones in flight: what they had so far)
    done: set[int]  # the jobs decoded to their end
    speeds: list[float]  # each done job's tokens per second, from its start to its end
    forwards: int  # batched forwards run
    steps: int  # sequence steps (a forward holds one per sequence in flight)
    tree_tokens: int  # query tokens over all sequence steps

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs.values())


def decode_class(lm: LoadedModel, slots: list[Decoder], prompts: list[list[int]], method: str,
                 jobs: int) -> ClassRun:
    """A class in steady state: ``len(slots)`` sequences always in flight, one forward a round.  Slot
    ``i`` (a tab: its decoder keeps its matrix and planner from one request to the next) decodes jobs
    ``i, i + n, i + 2n, ...``, job ``j`` being ``prompts[j % len(prompts)]``; the clock stops when
    ``jobs`` sequences are done, so every round it timed had all ``n`` slots busy.  The clock times the
    rounds (decoding); reading a new job's prompt when its slot frees is the same work for every
    method and stays off it."""
    n = len(slots)
    job = list(range(n))
    outputs: dict[int, list[int]] = {}
    done, speeds = set(), []
    decoding = [0.0] * n  # each slot's seconds on its current job
    forwards = steps = tree_tokens = 0
    seconds = 0.0
    for i, dec in enumerate(slots):
        dec.start(prompts[job[i] % len(prompts)])
    while len(done) < jobs:
        synchronize(lm.device)
        t0 = time.perf_counter()
        requests = [dec.prepare_step() for dec in slots]
        for dec, request, logits in zip(slots, requests, run_forwards(lm, requests)):
            dec.finish_step(request, logits)
        synchronize(lm.device)
        took = time.perf_counter() - t0
        seconds += took
        forwards, steps = forwards + 1, steps + n
        tree_tokens += sum(r.input_ids.shape[-1] for r in requests)
        for i, dec in enumerate(slots):
            outputs[job[i]] = list(dec.output)
            decoding[i] += took
            if dec.done and len(done) < jobs:
                done.add(job[i])
                speeds.append(len(dec.output) / decoding[i])
                job[i], decoding[i] = job[i] + n, 0.0
                dec.start(prompts[job[i] % len(prompts)])  # off the clock, as every prompt's reading
    return ClassRun(method, n, seconds, outputs, done, speeds, forwards, steps, tree_tokens)


def agree(a: ClassRun, b: ClassRun) -> bool:
    """Whether two runs decoded every job they share alike: equal where both finished it, else the
    shorter a prefix of the longer."""
    for j in a.outputs.keys() & b.outputs.keys():
        x, y = a.outputs[j], b.outputs[j]
        if (j in a.done and j in b.done and x != y) or x[:len(y)] != y[:len(x)]:
            return False
    return True


@dataclass
class ClassBench:
    """How each tab's decoders are made: TR with the auto tree, each from ``matrix_file`` (a new tab's
    hot start) or empty, each with a planner of its own."""

    lm: LoadedModel
    max_new_tokens: int
    k: int = 8
    matrix_file: str | None = None
    runs: list[ClassRun] = field(default_factory=list)

    def decoders(self, method: str, n: int) -> list[Decoder]:
        if method.startswith("greedy"):
            return [GreedyDecoder(self.lm, self.max_new_tokens) for _ in range(n)]
        return [TokenRecyclingDecoder(self.lm, tree="auto", k=self.k, matrix=self.matrix(),
                                      planner=TreePlanner(self.lm, k=self.k), max_new_tokens=self.max_new_tokens,
                                      trace_rows=False) for _ in range(n)]

    def matrix(self) -> AdjacencyMatrix:
        lm = self.lm
        if self.matrix_file is None:
            return AdjacencyMatrix(lm.vocab_size, self.k, lm.device, lm.fingerprint)
        return AdjacencyMatrix.load(self.matrix_file, lm.fingerprint, lm.vocab_size, lm.device).narrowed(self.k)

    def run(self, prompts: list[list[int]], sizes: list[int], repeats: int = 2, progress=print) -> list[dict]:
        """At each N of ``sizes``: every method ``repeats`` times, interleaved, each until ``2 N`` sequences
        were done with N always in flight; one row per N."""
        rows = []
        for n in sizes:
            for r in range(repeats):
                order = METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]
                for method in order:
                    run = decode_class(self.lm, self.decoders(method, n), prompts, method, jobs=2 * n)
                    self.runs.append(run)
                    progress(f"  N={n} {method}: {run.tokens / run.seconds:.1f} tok/s")
            rows.append(class_row([x for x in self.runs if x.n == n]))
        return rows


def class_row(runs: list[ClassRun]) -> dict:
    """One N's figures: per method the total and per-sequence tokens/s; TR's speedup and A/A."""
    by = {m: [r for r in runs if r.method == m] for m in METHODS}
    figures = {}
    for method, rs in by.items():
        per_seq = [speed for r in rs for speed in r.speeds]
        steps, forwards = sum(r.steps for r in rs), sum(r.forwards for r in rs)
        figures[method] = {"tok_per_s": sum(r.tokens for r in rs) / sum(r.seconds for r in rs),
                           "per_sequence_tok_per_s": statistics.median(per_seq) if per_seq else 0.0,
                           "forwards": forwards, "mat": sum(r.tokens for r in rs) / steps if steps else 0.0,
                           "tree_tokens": sum(r.tree_tokens for r in rs) / steps if steps else 0.0,
                           "batch_tokens": sum(r.tree_tokens for r in rs) / forwards if forwards else 0.0}
    greedy = figures["greedy"]["tok_per_s"]
    identical = all(agree(t, g) for t in by["tr"] for g in by["greedy"] + by["greedy-aa"])
    return {"n": runs[0].n, "methods": figures, "speedup": figures["tr"]["tok_per_s"] / greedy,
            "aa": figures["greedy-aa"]["tok_per_s"] / greedy, "identical": identical}


def format_class_table(rows: list[dict], cpu: str) -> str:
    lines = [f"A class on one server ({cpu}): N sequences decoded together, one forward a round",
             "| N | greedy tok/s (total) | TR tok/s (total) | TR per sequence | speedup | A/A | TR tree "
             "(tokens a step) | TR MAT | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        g, t = row["methods"]["greedy"], row["methods"]["tr"]
        lines.append(f"| {row['n']} | {g['tok_per_s']:.1f} | {t['tok_per_s']:.1f} | {t['per_sequence_tok_per_s']:.1f} "
                     f"| {row['speedup']:.2f}x | {row['aa']:.2f} | {t['tree_tokens']:.1f} | {t['mat']:.2f} "
                     f"| {'yes' if row['identical'] else 'NO'} |")
    one = next((r for r in rows if r["n"] == 1), None)
    if one is not None:
        base = one["methods"]["greedy"]["tok_per_s"]
        lines.append("Total tokens/s against one greedy sequence: " + ", ".join(
            f"N={r['n']}: greedy {r['methods']['greedy']['tok_per_s'] / base:.2f}x, "
            f"TR {r['methods']['tr']['tok_per_s'] / base:.2f}x" for r in rows))
    return "\n".join(lines)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--concurrency takes numbers separated by commas, e.g. 1,4,8,16 (got {text!r})") from None
    if not sizes or min(sizes) < 1 or max(sizes) > 256:
        raise ValueError(f"--concurrency takes numbers from 1 to 256 (got {text!r})")
    return sizes


def run_class(args, lm: LoadedModel, prompts, argv=None) -> int:
    """The bench's ``--concurrency`` mode (the bench's own arguments: prompts, tokens, k, matrix)."""
    from ..devices import cpu_info
    from .report import cpu_words, write_json

    sizes = parse_sizes(args.concurrency)
    ids = [lm.encode_prompt(p.text) for p in prompts]
    bench = ClassBench(lm, args.max_new_tokens, args.k, args.matrix)
    say = (lambda *_: None) if args.quiet else print
    if args.warmup:
        bench.run(ids[:2], [min(2, max(sizes))], repeats=1, progress=lambda *_: None)  # kernels and caches warm
        bench.runs.clear()
    rows = bench.run(ids, sizes, repeats=max(1, args.repeats), progress=say)
    cpu = cpu_words(cpu_info()) if lm.device.type == "cpu" else str(lm.device)
    print(format_class_table(rows, cpu))
    if not all(r["identical"] for r in rows):
        print("WARNING: TR's output differs from greedy's at some N", flush=True)
    if args.json:
        write_json({"kind": "class", "model": lm.name, "dtype": str(lm.dtype).removeprefix("torch."),
                    "max_new_tokens": args.max_new_tokens, "prompts": len(ids), "rows": rows},
                   args.json, "python -m tr_core.bench", argv)
    return 0
