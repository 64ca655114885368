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
from tr_core.race import Race

from .counters import charts_figure, counters_html
from .heatmap import heatmap_figure
from .phase_strip import phase_html
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
    def timed(name, build):
        t0 = time.perf_counter()
        out = build()
        panels[name].append(time.perf_counter() - t0)
        return out

    for _ in range(args.steps):
        step = race.step()
        step_secs.append(step.seconds)
        steps = race.decoder.steps
        tf = timed("tree", lambda: tree_figure(step, lm.token_text, "t"))
        hf = timed("heatmap", lambda: heatmap_figure(step, lm.token_text))
        timed("text", lambda: output_html(steps, lm.token_text))
        cf = timed("counters+charts", lambda: (counters_html(race.figures()),
                                               charts_figure([len(s.committed) for s in steps], race.speedups))[1])
        timed("phases", lambda: phase_html(step, lm.token_text))
        timed("to_json", lambda: [f.to_json() for f in (tf, hf, cf)])
    total = [sum(v[i] for v in panels.values()) for i in range(args.steps)]
    print(f"tree {args.tree}: {race.decoder.steps[-1].tree.size} draft nodes, {args.steps} steps")
    for name, v in panels.items():
        print(f"  {name:<16} median {statistics.median(v) * 1000:7.1f} ms   max {max(v) * 1000:7.1f} ms")
    print(f"  {'all panels':<16} median {statistics.median(total) * 1000:7.1f} ms   max {max(total) * 1000:7.1f} ms")
    print(f"  decoding step    median {statistics.median(step_secs) * 1000:7.1f} ms "
          f"(rendering / decoding = {statistics.median(total) / statistics.median(step_secs):.2f})")


if __name__ == "__main__":
    main()
