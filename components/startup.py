"""Start-up: load the model and get its forward-cost curve, with true progress, the curve cached on disk.

The curve (seconds of one forward by query length, which the auto tree plans with) takes tens of
seconds to measure on a CPU; it is kept in ``cost-curves/`` of the project's cache (``TR_CACHE``, else
``~/.cache/token_recycling``), one file per model, vocabulary, device, dtype and torch version, so later
starts skip it.  The folder is the operator's; nothing a visitor types reaches it.
"""
from __future__ import annotations

import contextvars
import hashlib
import json
import math
import os
import platform
import tempfile
import threading
import time
import weakref
from pathlib import Path

import torch

from tr_core.cost import COST_LENGTHS, time_forwards
from tr_core.devices import describe_machine, precision_words
from tr_core.gguf_cache import cache_root
from tr_core.planner import CostCurve, cost_curve_for

from .memory import set_aside_long_lived


CURVE_FORMAT = 3  # 2: the cache part (per_cache, prefix) is kept too; 3: and the fixed cache part


def cache_dir() -> Path:
    return cache_root() / "cost-curves"


def curve_path(lm) -> Path:
    device = str(lm.device)
    if lm.device.type == "cuda":
        device += ":" + torch.cuda.get_device_name(lm.device)
    else:
        device += f":{platform.machine()}:{os.cpu_count()}:{describe_machine(lm.device)}"
    key = json.dumps([CURVE_FORMAT, lm.name, lm.fingerprint, device, str(lm.dtype), torch.__version__,
                      bool(lm.prepacked)])
    return cache_dir() / f"cost-curve-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def read_cached_curve(lm) -> CostCurve | None:
    """The curve kept on disk for ``lm``; None when there is none (or it is unreadable)."""
    try:
        doc = json.loads(curve_path(lm).read_text())
        return CostCurve([int(q) for q in doc["lengths"]], [float(s) for s in doc["seconds"]],
                         per_cache=float(doc["per_cache"]), prefix=int(doc["prefix"]),
                         per_cache_fixed=float(doc.get("per_cache_fixed", 0.0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_curve(lm) -> None:
    path, tmp = curve_path(lm), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a file of its own, then renamed: two processes saving the same curve never mix their writes
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype),
                       "lengths": lm.cost_curve.lengths, "seconds": lm.cost_curve.seconds,
                       "per_cache": lm.cost_curve.per_cache, "prefix": lm.cost_curve.prefix,
                       "per_cache_fixed": lm.cost_curve.per_cache_fixed}, f)
        os.replace(tmp, path)
    except OSError:  # a read-only home or a full disk: measured again next start
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def with_progress(work, report, every: float = 0.5):
    """``work()`` on this thread, ``report(elapsed_seconds)`` called from another every ``every`` seconds
    until it ends; its result or error.  The work stays on the caller's thread (a server's model thread):
    torch work on a thread of its own would give the process a second OpenMP team, and with more workers
    than cores every forward slows, the ones timed for the cost curve included."""
    context = contextvars.copy_context()  # the request's context (the page's progress bar reads it)
    done = threading.Event()
    t0 = time.monotonic()

    def tell():
        while not done.wait(every):
            context.run(report, time.monotonic() - t0)
    report(0.0)
    reporter = threading.Thread(target=tell, daemon=True)
    reporter.start()
    try:
        return work()
    finally:
        done.set()
        reporter.join()


_WARM: weakref.WeakSet = weakref.WeakSet()  # models whose forwards have run once at every size here
_SET_ASIDE: weakref.WeakSet = weakref.WeakSet()  # models set aside from the collector once loaded and warm


def warm_kernels(lm) -> list[float] | None:
    """Forwards of every size the cost curve covers (1-96 tokens; two rounds, over a short cache),
    once per loaded model: the kernels' first calls (oneDNN builds a primitive per shape) happen here,
    not in a visitor's first steps.  The second round's seconds per length (``COST_LENGTHS``), or None
    where the model was warm already."""
    if lm.model in _WARM:
        return None
    seconds = time_forwards(lm, COST_LENGTHS, prefix=32, repeats=1)
    _WARM.add(lm.model)
    return seconds


SHAPE_TOLERANCE = 1.3  # a kept curve whose shape is further than this from today's forwards is timed again


def curve_still_holds(curve: CostCurve, lengths: list[int], seconds: list[float], up_to: int = 32) -> bool:
    """Whether a kept cost curve still has the shape of forwards timed just now (``seconds`` for
    ``lengths``): how much more ``q`` tokens cost than one, for every ``q`` up to ``up_to`` that both
    timed, agrees within ``SHAPE_TOLERANCE`` at the median.  A curve kept from a machine that was busy
    then, or from another threading, plans trees whose forwards cost what it never said."""
    kept = dict(zip(curve.lengths, curve.seconds))
    now = dict(zip(lengths, seconds))
    if 1 not in kept or 1 not in now or kept[1] <= 0 or now[1] <= 0:
        return False
    gaps = sorted(abs(math.log((now[q] / now[1]) / (kept[q] / kept[1])))
                  for q in now if 1 < q <= up_to and q in kept and kept[q] > 0 and now[q] > 0)
    return bool(gaps) and gaps[len(gaps) // 2] <= math.log(SHAPE_TOLERANCE)


def warm_up(hub, progress, curve_on_gpu=None) -> str:
    """Load the default model, warm its kernels and get its cost curve (from the cache when this
    machine measured it before; a curve timed in this process is neither warmed nor checked again:
    its forwards ran every size, under today's conditions); ``progress(fraction_or_steps, desc=...)``
    moves with each part, and the parts are counted as they will run (a cached curve needs no timing,
    a timing warms too).
    ``curve_on_gpu()``: measure the curve in a ZeroGPU call (it returns the curve, kept here)."""
    lm = with_progress(lambda: hub.get(None),
                       lambda t: progress((0, 2), desc=f"Step 1 of 2: loading the model ({t:.0f} s so far)"))
    timed_here = lm.cost_curve is not None  # timed in this process (a kept curve goes on lm once checked)
    if timed_here and not curve_on_gpu:
        _WARM.add(lm.model)  # its forwards ran every size
    kept = None if timed_here else read_cached_curve(lm)
    cached, stale = timed_here or kept is not None, False
    warmed = "the model has already run once at every size, so your first steps are not slowed by warm-up" \
        if not curve_on_gpu else "each GPU call warms the model up itself"
    if cached:
        timed = "timed earlier"
        if kept is not None and not curve_on_gpu:  # a kept curve: do today's forwards still have its shape?
            seconds = with_progress(lambda: warm_kernels(lm), lambda t: progress(
                (1, 2), desc=f"Step 2 of 2: first forwards of 1-96 tokens ({t:.0f} s)"))
            if seconds is not None and not curve_still_holds(kept, COST_LENGTHS, seconds):
                kept, cached, stale = None, False, True  # kept from other conditions: timed again, and kept anew
        if kept is not None:
            lm.cost_curve = kept
    if not cached:
        measure = (lambda: setattr(lm, "cost_curve", curve_on_gpu())) if curve_on_gpu else (lambda: cost_curve_for(lm))
        with_progress(measure, lambda t: progress((1, 2), desc=f"Step 2 of 2: timing forwards of 1-96 tokens for "
                                                               f"the auto tree, once per model and device ({t:.0f} s so far)"))
        save_curve(lm)
        if not curve_on_gpu:  # the curve's forwards ran every size here
            _WARM.add(lm.model)
        timed = ("timed again just now, since the kept timing no longer matched this machine's forwards"
                 if stale else "timed just now, kept for restarts")
    how = f"the draft tree's size is planned from how long the model took on this machine ({timed})"
    if lm.model not in _SET_ASIDE:  # once per model, not at every page's load (its visitors' objects would go too)
        set_aside_long_lived()  # the model too, now loaded (components.memory)
        _SET_ASIDE.add(lm.model)
    progress((2, 2), desc="Ready")
    why = f"; {lm.dtype_reason}" if lm.dtype_reason and not lm.dtype_reason.startswith("float32: the default") else ""
    return (f"Ready: {lm.name} on {describe_device(lm)} ({precision_words(lm.dtype)}{why}; your prompt goes "
            f"through the {lm.template}; {warmed}; {how}). Type a prompt and press Step.")


def describe_device(lm) -> str:
    return f"{lm.device} ({describe_machine(lm.device)})"
