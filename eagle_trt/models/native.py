"""The engine's C++ kernels (`csrc/*.cpp`): compiled on first use with the machine's compiler, loaded with ctypes.

One shared library holds them all: the row-invariant attention (`native_attention.py`), the bf16 layer's
fused row ops (`native_ops.py`) and the bf16 projections on AMX tiles (`native_gemm.py`). It is built with `$CXX` (else g++, else c++) into `$EAGLE_TRT_CACHE/kernels`
(default `~/.cache/eagle-trt/kernels`), once per source, flags and CPU; the write is atomic. Without a compiler,
or with EAGLE_TRT_NATIVE=0, `library()` returns None and the engine keeps its torch paths (the reason is logged
once).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = [CSRC / "tree_attention.cpp", CSRC / "row_ops.cpp", CSRC / "gemm_amx.cpp", CSRC / "decoder_stack.cpp",
           CSRC / "draft_layer.cpp"]
HEADERS = [CSRC / "simd.h", CSRC / "amx.h", CSRC / "kernels.h"]
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared", "-std=c++17"]

_loaded: "ctypes.CDLL | None | bool" = False  # False: not tried yet


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
    """Compile the kernels (if these sources, compiler, flags and CPU have no build yet); returns the .so path.

    Raises RuntimeError with the compiler's message when it fails."""
    compiler = compiler or _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    src = b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    key = hashlib.sha256(b"\0".join([src, compiler.encode(), " ".join(FLAGS).encode(), _cpu_key().encode()]))
    out_dir = out_dir or cache_dir()
    target = out_dir / f"eagle_trt_kernels-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            names = ", ".join(p.name for p in SOURCES)
            raise RuntimeError(f"{compiler} failed on {names}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (disabled, no compiler, or the build failed; the reason is logged once)."""
    global _loaded
    if _loaded is not False:
        return _loaded  # type: ignore[return-value]
    _loaded = None
    if not enabled():
        return None
    try:
        # torch is loaded first (the import above): the kernels' OpenMP then resolves to the runtime torch uses (one
        # thread pool).
        _loaded = ctypes.CDLL(str(build()))
    except (RuntimeError, OSError) as exc:
        log.warning("native kernels unavailable (bf16 projections fall back to oneDNN, attention to float64, the "
                    "layer's row ops to torch): %s", exc)
    return _loaded


_shared: dict = {}


def shared(wrapper, usable=None):
    """One `wrapper(library())` per process (a kernel's ctypes bindings), or None: no library, or `usable(lib)` says
    this CPU cannot run that kernel."""
    if wrapper not in _shared:
        lib = library()
        ok = lib is not None and (usable is None or usable(lib))
        _shared[wrapper] = wrapper(lib) if ok else None
    return _shared[wrapper]


def byte_mask(mask: torch.Tensor | None, rows: int, keys: int) -> torch.Tensor | None:
    """A bool [rows, keys] visibility mask as the bytes the kernels read (a view: the forward's mask is built
    contiguous), or None for none."""
    if mask is None:
        return None
    if mask.shape != (rows, keys) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool [{rows}, {keys}], got {mask.dtype} {tuple(mask.shape)}")
    return mask.contiguous().view(torch.uint8)


_scratch = torch.empty(0, dtype=torch.bfloat16)


def scratch(elements: int) -> torch.Tensor:
    """A bf16 work buffer of at least `elements`, kept and grown across calls: the one-call forwards (decoder stack,
    draft layer) carve their intermediates from it instead of allocating per token. They run one at a time and
    return nothing that points into it."""
    global _scratch
    if _scratch.numel() < elements:
        _scratch = torch.empty(elements, dtype=torch.bfloat16)
    return _scratch


def out_buffer(out, shape: tuple, dtype):
    """Where a kernel writes its result: `out` (a caller's buffer, reused across a forward's layers) if given, which
    must be a contiguous CPU tensor of this shape and dtype, else a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype)
    if out.dtype is not dtype or not out.is_cpu or not out.is_contiguous() or out.shape != shape:
        raise ValueError(f"out must be a contiguous {dtype} CPU tensor of shape {list(shape)}, got {out.dtype} "
                         f"{list(out.shape)}")
    return out
