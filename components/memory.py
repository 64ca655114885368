"""Give a freed session's memory back to the operating system.

PyTorch's CPU tensors come from ``malloc``; glibc keeps freed blocks in per-thread arenas, so a
server whose sessions come and go on many worker threads would keep the peak for good.
``malloc_trim`` returns the free pages of every arena.  Elsewhere (macOS, musl) it is a no-op.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import lru_cache


@lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Collect garbage, then trim the allocator's arenas; True where the trim exists (glibc)."""
    gc.collect()
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
