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
"""

from __future__ import annotations

import logging
import os

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
                except Exception:
                    _state.clear()
                    raise
    return library()


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
