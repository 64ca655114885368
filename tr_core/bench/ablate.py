"""``python -m tr_core.bench.ablate``: what each addition to the paper's drafting adds, one row each.

Token Recycling on a fixed tree (``--tree``, default the paper's 80 nodes), the matrix hot-started
across the prompts, with the additions switched on one at a time, in this order:

* ``paper``: the paper's method, ``PaperTokenRecycling`` (full shape, last write wins, no context retrieval);
  each row below is ``TokenRecyclingDecoder`` with more of its ``Additions`` switched on;
* ``+no blank drafts``: no forward tokens for drafts from rows never written;
* ``+verified rows``: where a token occurs twice in a tree, its row is written from the committed text;
* ``+ngram lookup``: prompt lookup's 3..1-gram continuation grafted into the tree (``--lookup`` tokens);
* ``+suffix retrieval``: the continuation of the longest suffix match over the whole context instead;
* ``+best nodes a step``: the same budget (``--tree``'s nodes + ``--lookup``) filled each step with the
  best nodes of the paper's 80 (the auto tree's universe) and the continuation by estimated
  acceptance, rather than a fixed tree plus a continuation (``node_budget`` with ``tree="auto"``:
  blank drafts and unlikely deep nodes give way to a long copy).
* ``+pair rows``: a node's children drafted from the row of the pair (its parent, itself) where that
  pair was seen, else from ``M`` (``tr_core.pairs``): the draft sees one more token of context.

Each row gives MAT (tokens per step), the mean forward tokens, and their ratio: tokens committed per
forward token, what a small tree must raise.  These do not depend on the hardware (a fixed tree,
greedy decoding), so any machine gives the same rows; outputs are checked against greedy decoding's
(every variant is lossless).  The default prompts are the calibration split: a change is justified
there, and reported on the evaluation split (``--split eval``).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

from .data import PROMPTS_HELP, SPLITS, load_prompts
from .report import write_json

_OURS = dict(drop_blank=True, verified_rows=True, retrieval="suffix")
VARIANTS = (  # (row, the additions on top of the paper's method: None = PaperTokenRecycling itself)
    ("paper", None),
    ("+no blank drafts", dict(drop_blank=True, verified_rows=False, lookup=0, pair_rows=False)),
    ("+verified rows", dict(drop_blank=True, verified_rows=True, lookup=0, pair_rows=False)),
    ("+ngram lookup", dict(drop_blank=True, verified_rows=True, retrieval="ngram", pair_rows=False)),
    ("+suffix retrieval", dict(_OURS, pair_rows=False)),
    ("+best nodes a step", dict(_OURS, node_budget="tree", pair_rows=False)),
    ("+pair rows", dict(_OURS, node_budget="tree", pair_rows=True)),
)


@dataclass
class Row:
    name: str
    tokens: int
    steps: int
    forward_tokens: int
    identical: int
    prompts: int

    @property
    def mat(self) -> float:
        return self.tokens / max(self.steps, 1)

    @property
    def mean_forward(self) -> float:
        return self.forward_tokens / max(self.steps, 1)

    def to_json(self) -> dict:
        return {"name": self.name, "mat": round(self.mat, 3), "mean_forward_tokens": round(self.mean_forward, 2),
                "per_forward_token": round(self.mat / self.mean_forward, 4), "identical": self.identical,
                "prompts": self.prompts, "steps": self.steps}


def run_variant(lm, prompts: list[list[int]], tree: str, lookup: int, max_new_tokens: int, settings: dict | None):
    """One variant over every prompt with one hot-started matrix; returns its outputs and counts.

    ``settings``: the :class:`~tr_core.decoders.Additions` fields switched (None: the paper's method,
    :class:`~tr_core.decoders.PaperTokenRecycling`).  A node budget (``"tree"``: ``tree``'s nodes +
    the continuation's) is filled from the auto tree's universe, the paper's 80 nodes."""
    from ..decoders import Additions, PaperTokenRecycling, TokenRecyclingDecoder
    from ..matrix import AdjacencyMatrix
    from ..trees import load_tree

    matrix = AdjacencyMatrix(lm.vocab_size, 8, lm.device, lm.fingerprint)
    if settings is None:
        make = lambda: PaperTokenRecycling(lm, tree, matrix=matrix, max_new_tokens=max_new_tokens,  # noqa: E731
                                           trace_rows=False)
    else:
        additions = Additions(**{"lookup": lookup, **settings})
        shape = tree
        if additions.node_budget == "tree":
            additions, shape = replace(additions, node_budget=load_tree(tree).size + lookup), "auto"
        make = lambda: TokenRecyclingDecoder(lm, tree=shape, matrix=matrix, max_new_tokens=max_new_tokens,  # noqa: E731
                                             trace_rows=False, additions=additions)
    outputs, steps, forward = [], 0, 0
    for ids in prompts:
        dec = make()
        outputs.append(dec.generate(ids))
        steps += len(dec.steps)
        forward += sum(s.forward_tokens for s in dec.steps)
    return outputs, steps, forward


def format_rows(rows: list[Row]) -> str:
    lines = [f"{'variant':<20} {'MAT':>6} {'fwd tokens':>10} {'MAT/fwd':>8} {'identical':>10}", "-" * 58]
    for r in rows:
        lines.append(f"{r.name:<20} {r.mat:6.2f} {r.mean_forward:10.2f} {r.mat / r.mean_forward:8.3f} "
                     f"{r.identical:>5}/{r.prompts:<4}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from ..decoders import GreedyDecoder
    from ..devices import cpu_info
    from ..models import ModelLoadError, load_model

    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.ablate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True, help=PROMPTS_HELP)
    ap.add_argument("--split", choices=sorted(SPLITS), default="calib")
    ap.add_argument("--limit", type=int, default=3, help="prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--tree", default="paper-80", help="a fixed tree (preset, chain-N or JSON file)")
    ap.add_argument("--lookup", type=int, default=24, help="continuation tokens grafted in the lookup rows")
    ap.add_argument("--model", default=None)
    ap.add_argument("--variants", default=None, help="comma list of the rows to run (default: all, in order)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = [name for name, _ in VARIANTS]
    chosen = names if args.variants is None else [v.strip() for v in args.variants.split(",") if v.strip()]
    if not chosen or any(v not in names for v in chosen):
        ap.error(f"--variants takes names among: {', '.join(names)}")
    if args.limit < 1 or args.max_new_tokens < 1 or args.lookup < 1:
        ap.error("--limit, --max-new-tokens and --lookup must be at least 1")
    try:
        prompts = load_prompts(args.prompts, args.limit, offset=SPLITS[args.split])
        if not prompts:
            raise ValueError(f"no prompts in {args.prompts}")
        lm = load_model(args.model, "cpu", "float32")
        ids = [lm.encode_prompt(p.text) for p in prompts]
        reference = [GreedyDecoder(lm, args.max_new_tokens).generate(x) for x in ids]
        rows = []
        for name, settings in (v for v in VARIANTS if v[0] in chosen):
            outputs, steps, forward = run_variant(lm, ids, args.tree, args.lookup, args.max_new_tokens, settings)
            same = sum(a == b for a, b in zip(outputs, reference))
            rows.append(Row(name, sum(map(len, outputs)), steps, forward, same, len(ids)))
            print(format_rows(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    except (OSError, ValueError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{lm.name}, tree {args.tree}, lookup {args.lookup}, {args.split} split, {len(ids)} prompts x "
          f"{args.max_new_tokens} tokens; CPU {cpu_info().get('model', '?')}")
    print(format_rows(rows))
    if args.json:
        write_json({"tree": args.tree, "lookup": args.lookup, "split": args.split, "limit": args.limit,
                    "max_new_tokens": args.max_new_tokens, "model": lm.name,
                    "rows": [r.to_json() for r in rows]}, args.json, "python -m tr_core.bench.ablate", argv)
    return 0 if all(r.identical == r.prompts for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
