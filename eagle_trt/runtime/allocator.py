"""Keep freed large buffers in the process heap instead of returning them to the OS.

glibc serves allocations above its mmap threshold (128 KiB at start) with fresh mmap'd pages and unmaps
them on free, so every decode step that allocates a KV read, attention scores or a logits row pays page
faults and zeroing again. Measured on the project machine (2 threads, bf16, 17 query rows, 1000 cached
tokens): float64 attention of one layer went from 1.95 ms to 0.60 ms, and converting K/V from 0.78 ms
to 0.05 ms, once the thresholds were raised. EAGLE_TRT_MALLOPT=0 turns this off (for A/B timing).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_LIMIT = 1 << 30  # 1 GiB: larger blocks (weights loads) still get their own mapping
_done = False


def keep_large_blocks() -> bool:
    """Raise glibc's mmap and trim thresholds once per process. Returns whether the setting is active."""
    global _done
    if _done:
        return True
    if os.environ.get("EAGLE_TRT_MALLOPT", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS, Windows): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    _done = bool(mallopt(_M_MMAP_THRESHOLD, _LIMIT)) and bool(mallopt(_M_TRIM_THRESHOLD, _LIMIT))
    return _done
