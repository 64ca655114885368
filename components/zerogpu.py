"""Hugging Face ZeroGPU support without depending on it.

On a ZeroGPU Space, functions that use the GPU must be wrapped in ``spaces.GPU`` (bare, or with
``duration=`` seconds). Elsewhere the ``spaces`` package is absent and the same code must run
unchanged: :func:`gpu_task` then returns the function as it is.
"""
from __future__ import annotations

import importlib


def _spaces():
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def gpu_task(fn=None, *, duration: int | None = None):
    """``@gpu_task`` or ``@gpu_task(duration=60)``: ``spaces.GPU`` when available, else a no-op."""
    spaces = _spaces()

    def wrap(f):
        if spaces is None:
            return f
        return spaces.GPU(f) if duration is None else spaces.GPU(duration=duration)(f)
    return wrap(fn) if fn is not None else wrap
