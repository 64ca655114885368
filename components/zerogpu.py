"""Hugging Face ZeroGPU support without depending on it.

On a ZeroGPU Space, functions that use the GPU must be wrapped in ``spaces.GPU`` (bare, or with
``duration=`` seconds). Elsewhere the ``spaces`` package is absent and the same code must run
unchanged: :func:`gpu_task` then returns the function as it is.
"""
from __future__ import annotations

import importlib
import math

FLOOR_SECONDS, CAP_SECONDS = 15, 120  # what a GPU call asks for at least and at most
TOKEN_SECONDS = 0.05  # a forward's seconds where none was measured (a 7B model's on a shared GPU)
SETUP_SECONDS = 5.0  # prefill, the planner, the matrix crossing


def gpu_seconds(tokens: int, token_seconds: float | None, lanes: int = 2) -> int:
    """The ``duration`` a GPU call asks for: ``lanes`` decoders of ``tokens`` new tokens each, at
    ``token_seconds`` a forward (the model's measured greedy forward; ``TOKEN_SECONDS`` where unknown),
    twice over for tree forwards and host work, plus set-up; within ``FLOOR_SECONDS``..``CAP_SECONDS``.
    ZeroGPU weighs what is asked against a visitor's quota: a short run asks for little."""
    per = token_seconds if token_seconds and token_seconds > 0 else TOKEN_SECONDS
    need = 2.0 * lanes * max(int(tokens), 1) * per + SETUP_SECONDS
    return int(min(max(math.ceil(need), FLOOR_SECONDS), CAP_SECONDS))


def _spaces():
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def gpu_task(fn=None, *, duration: int | None = None):
    """``@gpu_task`` or ``@gpu_task(duration=60)``: ``spaces.GPU`` when available, else a no-op.
    ``duration`` may be a function of the call's arguments (seconds), as ``spaces.GPU`` allows."""
    spaces = _spaces()

    def wrap(f):
        if spaces is None:
            return f
        return spaces.GPU(f) if duration is None else spaces.GPU(duration=duration)(f)
    return wrap(fn) if fn is not None else wrap
