"""Row-invariant attention from a small C++ kernel (`csrc/tree_attention.cpp`), compiled on first use.

Each output row depends only on its query and its visible keys in slot order, so a tree-verify row gives the
same bits as decoding that token alone (the property greedy losslessness rests on) at fp32 speed. The bf16
target uses it (`llama.pick_attention`); the float64 fallback (`layers.attention_fp64`) has the same property
at about twice the cost (`scripts/kernel_timings.py`).

The kernel is built with the machine's C++ compiler (`$CXX`, else g++, else c++) into
`$EAGLE_TRT_CACHE/kernels` (default `~/.cache/eagle-trt/kernels`), once per source, flags and CPU; the write is
atomic. Without a compiler, or with EAGLE_TRT_NATIVE=0, `load()` returns None and the engine uses the fallback.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "tree_attention.cpp"
HEADERS = [Path(__file__).with_name("csrc") / "simd.h"]
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared", "-std=c++17"]
_TYPES = {torch.float32: 0, torch.bfloat16: 1}

_loaded: "NativeAttention | None | bool" = False  # False: not tried yet


def enabled() -> bool:
    return os.environ.get("EAGLE_TRT_NATIVE", "1") != "0"


def cache_dir() -> Path:
    root = os.environ.get("EAGLE_TRT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "eagle-trt") / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_key() -> str:
    # -march=native code must not run on another CPU: the CPU's flags are part of the cache key.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build(compiler: str | None = None, out_dir: Path | None = None) -> Path:
    """Compile the kernel (if this source, compiler, flags and CPU have no build yet); returns the .so path.

    Raises RuntimeError with the compiler's message when it fails."""
    compiler = compiler or _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    src = b"".join(p.read_bytes() for p in (SOURCE, *HEADERS))
    key = hashlib.sha256(b"\0".join([src, compiler.encode(), " ".join(FLAGS).encode(), _cpu_key().encode()]))
    out_dir = out_dir or cache_dir()
    target = out_dir / f"tree_attention-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed on {SOURCE.name}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class NativeAttention:
    """`attention(q, k, v, mask)` with the contract of `layers.attention`, computed by the compiled kernel."""

    def __init__(self, path: Path):
        # torch first: the kernel's OpenMP calls then resolve to the runtime torch already loaded (one thread pool).
        lib = ctypes.CDLL(str(path))
        fn = lib.eagle_trt_tree_attention
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        fn.argtypes = [ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, ptr,
                       i32, i32, i32, i32, i32, ctypes.c_float, i32, i32]
        fn.restype = i32
        self._fn = fn
        self.path = path

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
        """Shapes the kernel takes (its fixed scratch): up to 64 query heads per KV head, head_dim up to 1024."""
        return kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= 64 and head_dim <= 1024

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q: [H, T, D], k/v: [Hkv, S, D] (any head/row strides, last dim contiguous), mask: [T, S] bool or None.

        Returns [T, H*D] in q's dtype."""
        h, t, d = q.shape
        hkv, s, _ = k.shape
        kind = _TYPES.get(q.dtype)
        if kind is None or k.dtype != q.dtype or v.dtype != q.dtype:
            raise TypeError(f"native attention takes float32 or bfloat16, got {q.dtype}/{k.dtype}/{v.dtype}")
        if q.stride(-1) != 1:
            q = q.contiguous()
        if k.stride(-1) != 1:
            k = k.contiguous()
        if v.stride(-1) != 1:
            v = v.contiguous()
        m = None
        if mask is not None:
            if mask.shape != (t, s) or mask.dtype != torch.bool:
                raise ValueError(f"mask must be bool [{t}, {s}], got {mask.dtype} {tuple(mask.shape)}")
            m = mask.contiguous().view(torch.uint8)  # a view: the forward's mask is built contiguous
        out = torch.empty(t, h * d, dtype=q.dtype)
        rc = self._fn(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
                      v.data_ptr(), v.stride(0), v.stride(1), m.data_ptr() if m is not None else None,
                      out.data_ptr(), h, hkv, t, s, d, 1.0 / math.sqrt(d), kind, torch.get_num_threads())
        if rc != 0:
            why = "out of memory" if rc == -1 else f"unsupported shape (heads {h}/{hkv}, head_dim {d})"
            raise RuntimeError(f"native attention kernel failed: {why}")
        return out


def load() -> NativeAttention | None:
    """The compiled kernel, or None (disabled, no compiler, or the build failed; the reason is logged once)."""
    global _loaded
    if _loaded is not False:
        return _loaded  # type: ignore[return-value]
    _loaded = None
    if not enabled():
        return None
    try:
        _loaded = NativeAttention(build())
    except (RuntimeError, OSError) as exc:
        log.warning("native attention unavailable, using the float64 fallback: %s", exc)
    return _loaded
