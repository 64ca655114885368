"""How long the app takes to draw one step: ``python -m components.render_bench``.

Decodes a few steps with the paper's 80-node tree on the embedded model, then times building every
panel (tree, heatmap, text, counters, charts, phases) for each step, and prints the figures beside the
step's own decoding time.
"""
from __future__ import annotations

import argparse
import statistics
import time

from tr_core import GreedyDecoder, TokenRecyclingDecoder, load_model

from .counters import charts_figure, counters_html
from .heatmap import heatmap_figure
from .phase_strip import phase_html
from .race import Race
from .text_view import output_html
from .tree_plot import tree_figure


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m components.render_bench")
    ap.add_argument("--tree", default="paper-80")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default=None)
    args = ap.parse_args(argv)
    lm = load_model(args.model)
    race = Race(TokenRecyclingDecoder(lm, tree=args.tree, lookup=0, max_new_tokens=200), GreedyDecoder(lm, 200))
    race.start(lm.encode_prompt("Explain how a bicycle works, in a few short paragraphs."))
    panels = {"tree": [], "heatmap": [], "text": [], "counters+charts": [], "phases": [], "to_json": []}
    step_secs = []
    for _ in range(args.steps):
        step = race.step()
        step_secs.append(step.seconds)
        steps = race.decoder.steps
        t = time.perf_counter
        a = t(); tf = tree_figure(step, lm.token_text, "t"); panels["tree"].append(t() - a)
        a = t(); hf = heatmap_figure(step, lm.token_text); panels["heatmap"].append(t() - a)
        a = t(); output_html(steps, lm.token_text); panels["text"].append(t() - a)
        a = t()
        counters_html(race.figures())
        cf = charts_figure([len(s.committed) for s in steps], race.speedups)
        panels["counters+charts"].append(t() - a)
        a = t(); phase_html(step, lm.token_text); panels["phases"].append(t() - a)
        a = t(); tf.to_json(); hf.to_json(); cf.to_json(); panels["to_json"].append(t() - a)
    total = [sum(v[i] for v in panels.values()) for i in range(args.steps)]
    print(f"tree {args.tree}: {race.decoder.steps[-1].tree.size} draft nodes, {args.steps} steps")
    for name, v in panels.items():
        print(f"  {name:<16} median {statistics.median(v) * 1000:7.1f} ms   max {max(v) * 1000:7.1f} ms")
    print(f"  {'all panels':<16} median {statistics.median(total) * 1000:7.1f} ms   max {max(total) * 1000:7.1f} ms")
    print(f"  decoding step    median {statistics.median(step_secs) * 1000:7.1f} ms "
          f"(rendering / decoding = {statistics.median(total) / statistics.median(step_secs):.2f})")


if __name__ == "__main__":
    main()
