"""The engine's compiled CPU kernels: built on first use with the machine's C++ compiler, bound with ctypes.

    from eagle_trt.models import native
    lib = native.library()          # None: disabled, no compiler, or the build failed (native.unavailable says why)
    lib.isa_name                     # "amx", "avx512" or "avx2"

- `isa.py`      which instruction set to build for (EAGLE_TRT_ISA forces a lower one)
- `build.py`    compile once per source, flags and CPU into a shared cache (locked, atomic, with a timeout)
- `bindings.py` the ctypes table, read from csrc/kernels.h
- `gemm.py`, `ops.py`, `stack.py`  the Python faces of the kernels; `kernels.py` puts them together for a model

EAGLE_TRT_NATIVE=0 turns the kernels off (the torch reference runs). EAGLE_TRT_REQUIRE_NATIVE=1 makes a missing
compiler or a failed build an error instead of a fallback (for CI: a skipped kernel test would hide it).
EAGLE_TRT_INT8_PREFETCH=BYTES sets how far ahead the int8 block projections' vector path prefetches its weights
(0: not at all; default 4096 on Intel CPUs, 0 elsewhere; csrc/gemm_int8.cpp says why): the bits never depend on it.
"""

from __future__ import annotations

import logging
import os

from eagle_trt.errors import InputError
from eagle_trt.models import isa
from eagle_trt.models.native import bindings, build

log = logging.getLogger(__name__)


class NativeUnavailable(RuntimeError):
    """EAGLE_TRT_REQUIRE_NATIVE=1 and the kernels could not be built or loaded."""


_state: dict = {}


def enabled() -> bool:
    return os.environ.get("EAGLE_TRT_NATIVE", "1") != "0"


def required() -> bool:
    return os.environ.get("EAGLE_TRT_REQUIRE_NATIVE", "0") not in ("", "0")


def library():
    """The compiled kernels (one per process), or None: disabled, no compiler, or the build failed; the reason is
    logged once and kept in `unavailable()`. With EAGLE_TRT_REQUIRE_NATIVE=1 a failure raises NativeUnavailable."""
    if "lib" in _state:
        if _state["lib"] is None and _state["why"] and required() and enabled():
            raise NativeUnavailable("EAGLE_TRT_REQUIRE_NATIVE=1 but the native kernels are unavailable: "
                                    f"{_state['why']}")
        return _state["lib"]
    _state["lib"], _state["why"] = None, "disabled (EAGLE_TRT_NATIVE=0)" if not enabled() else None
    if enabled():
        try:
            isa.requested()  # a bad EAGLE_TRT_ISA is the user's error (exit 2), not a reason to fall back
        except Exception:
            _state.clear()
            raise
        # torch is loaded first: the kernels' OpenMP then resolves to the runtime torch uses (one thread pool).
        # Imported here: torch takes over a second to import, and native.build and bindings need none of it.
        import torch  # noqa: F401  (imported for that effect)

        try:
            _state["lib"] = bindings.Library(build.build())
        except (RuntimeError, OSError, AttributeError, ValueError) as exc:
            _state["why"] = str(exc)
            log.warning("native kernels unavailable (the torch reference runs instead): %s", exc)
        else:
            if _state["lib"].isa_name is None:
                _state["lib"], _state["why"] = None, "this CPU (or EAGLE_TRT_ISA) lacks AVX2 + FMA"
            else:
                try:
                    isa.check_isa(_state["lib"].isa_name)
                    _apply_prefetch(_state["lib"])
                except Exception:
                    _state.clear()
                    raise
    return library()


def prefetch_requested() -> int | None:
    """EAGLE_TRT_INT8_PREFETCH in bytes (None when unset); an InputError for a value that is not a whole number of
    bytes from 0 to 1 MiB."""
    raw = os.environ.get("EAGLE_TRT_INT8_PREFETCH")
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 1 << 20:
        raise InputError(f"EAGLE_TRT_INT8_PREFETCH={raw!r}: expected a prefetch distance in bytes from 0 (off) to "
                         "1048576, e.g. 4096; unset it for this CPU's default")
    return value


def _apply_prefetch(lib) -> None:
    value = prefetch_requested()
    if value is not None:
        lib.int8_set_prefetch(value)


def unavailable() -> str | None:
    """Why `library()` is None (after it was called), or None when the kernels are loaded."""
    library_or_none()
    return _state.get("why") if _state.get("lib") is None else None


def library_or_none():
    """`library()` that does not raise when the kernels are unavailable (for probes such as `bf16_is_fast`); a bad
    EAGLE_TRT_ISA is still an InputError."""
    try:
        return library()
    except NativeUnavailable:
        return None


def reset() -> None:
    """Forget the loaded library (tests that change the environment)."""
    _state.clear()
