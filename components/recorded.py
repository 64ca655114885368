"""ZeroGPU: a whole run decoded in one GPU call, then stepped through on the page.

On a ZeroGPU Space each ``spaces.GPU`` call runs in a process forked for it: its arguments and its
result cross pickled, and whatever it changed in its own memory is gone when it returns.  A live
race (a model, two KV caches on the GPU) cannot live across calls, so there:

* the model is loaded at start-up, outside any GPU call (``app.main``), and the hub is frozen:
  nothing is ever loaded inside a call;
* the first Step of a prompt decodes the whole run, TR (or PTD) against greedy, in **one** GPU call
  (:meth:`Recorder.record`), timed there step by step exactly as a live race is; the page then steps
  through the recorded ``Run`` (the run-file records), with every panel, the history and Teach mode;
* what crosses is small and plain: the prompt and settings in, the ``Run`` out, plus the tab's
  hot-start matrix both ways, on the host (a few MB of token ids);
* the cost curve the auto tree plans with is measured in a GPU call at start-up
  (:meth:`Recorder.cost_curve`) and kept in the main process, so every later call inherits it;
* the Compare tab runs every method in one call and returns plain rows (:meth:`Recorder.compare`).

The planner's acceptance statistics live inside a call and start from the shipped priors each run.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tr_core.devices import oom_message
from tr_core.matrix import AdjacencyMatrix
from tr_core.runs import Run

from .session import SHIPPED_MATRIX, MatrixOrigin, MatrixState, Session, Settings, UserError


@dataclass
class Recording:
    """What comes back from a GPU call: the run (or why there is none) and the matrix after it."""

    run: Run | None
    matrix: AdjacencyMatrix | None  # on the host
    error: str = ""
    notice: str = ""
    origin: MatrixOrigin | None = None  # where the matrix came from


class Recorder:
    """The GPU side of the app on ZeroGPU: functions of small, picklable data (module doc)."""

    def __init__(self, hub):
        self.hub = hub

    def record(self, prompt: str, s: Settings, cap: int, handed: MatrixState) -> Recording:
        """Decode ``prompt`` to the end with settings ``s`` against greedy, from the matrix the tab
        ``handed`` over (``MatrixState.handed``: one of the same start, or none); the run and the matrix."""
        sess = Session(matrix_state=replace(handed, warm_file=str(SHIPPED_MATRIX)))
        try:
            sess.begin(self.hub, prompt, s, cap)
            notice = sess.notice  # e.g. where the matrix came from: said with the first step shown
            while sess.in_progress:
                sess.advance()
        except UserError as err:
            return Recording(None, handed.matrix, str(err))
        except torch.OutOfMemoryError:
            lm = self.hub.get(s.model)
            return Recording(None, handed.matrix, oom_message(lm.name, lm.dtype, lm.device))
        run, after = sess.view().to_run(), sess.matrix_state
        if after.matrix is None:
            return Recording(run, handed.matrix, notice=notice, origin=handed.origin)
        return Recording(run, after.matrix.to("cpu"), notice=notice, origin=after.origin)

    def token_seconds(self, spec) -> float | None:
        """Seconds of one greedy forward of model ``spec``, where it is loaded and its cost curve measured."""
        lm = self.hub.peek(spec)
        curve = getattr(lm, "cost_curve", None)
        return curve.greedy() if curve is not None else None

    def record_seconds(self, prompt: str, s: Settings, cap: int, *_) -> int:
        """The GPU time :meth:`record` asks for: the run's two lanes (``components.zerogpu.gpu_seconds``)."""
        from .zerogpu import gpu_seconds

        return gpu_seconds(min(int(s.max_new_tokens or cap), cap), self.token_seconds(s.model), lanes=2)

    def compare_seconds(self, prompt: str, model: str, max_new: int) -> int:
        """The GPU time :meth:`compare` asks for: five methods to the end."""
        from .zerogpu import gpu_seconds

        return gpu_seconds(int(max_new), self.token_seconds(model), lanes=5)

    def compare(self, prompt: str, model: str, max_new: int) -> list[dict] | str:
        """Every method run to the end on ``prompt`` (``components.compare.compare_methods``): plain rows,
        or the refusal in words."""
        from .compare import compare_rows

        return compare_rows(self.hub, prompt, model, max_new)

    def cost_curve(self):
        """The default model's forward-cost curve, measured on the GPU (it lives on in the main process)."""
        from tr_core.planner import cost_curve_for

        return cost_curve_for(self.hub.get(None))


def load_at_start_up(hub) -> None:
    """ZeroGPU's pattern: the default model loaded in the main process before the app serves (on the
    host, then moved to ``cuda``), and the hub frozen, so that no GPU call ever loads one."""
    from tr_core.models import ModelLoadError

    try:
        hub.get(None)
    except ModelLoadError as err:  # the page still opens, replays run files and says why in the status line
        print(f"warning: the model did not load at start-up: {err}", flush=True)
        hub.start_error = str(err)
    hub.freeze()
