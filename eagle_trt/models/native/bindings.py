"""The compiled library's entry points, bound with ctypes from their declarations in `csrc/kernels.h`.

The header is the one table of signatures: every .cpp includes it (the compiler checks each definition against it)
and `parse_header` reads the same declarations into ctypes argument and return types here, so the two sides cannot
drift apart. `Library` binds every declared function (a declared function the library lacks is an error at load)
and exposes it without its `eagle_trt_` prefix: `lib.gemm(...)`.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from eagle_trt.models.native.build import CSRC
from eagle_trt.models.isa import BACKENDS

HEADER = CSRC / "kernels.h"
PREFIX = "eagle_trt_"
_SCALARS = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float, "void": None}
_DECLARATION = re.compile(r"\b(int|int64_t|float|void)\s+(" + PREFIX + r"\w+)\s*\(([^)]*)\)\s*;")


def _ctype(param: str, where: str):
    """One C parameter (`const void* const* weights`, `int64_t K`, `void`) -> its ctypes type."""
    if "*" in param:
        return ctypes.c_void_p
    words = param.replace("const", " ").split()
    if len(words) != 2 or words[0] not in _SCALARS:
        raise ValueError(f"{HEADER.name}: cannot bind parameter {param.strip()!r} of {where}")
    return _SCALARS[words[0]]


def parse_header(text: str) -> dict[str, tuple[object, list]]:
    """Declarations `ret eagle_trt_name(params);` -> {name: (restype, argtypes)}."""
    text = re.sub(r"//[^\n]*", "", text)
    table = {}
    for ret, name, params in _DECLARATION.findall(" ".join(text.split())):
        params = params.strip()
        args = [] if params in ("", "void") else [_ctype(p, name) for p in params.split(",")]
        table[name] = (_SCALARS[ret], args)
    if not table:
        raise ValueError(f"{HEADER.name}: no {PREFIX}* declarations found")
    return table


def signatures() -> dict[str, tuple[object, list]]:
    return parse_header(HEADER.read_text())


class Library:
    """A loaded kernel library with every function of kernels.h bound: `lib.gemm(...)` calls eagle_trt_gemm."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._cdll = ctypes.CDLL(str(path))
        for name, (restype, argtypes) in signatures().items():
            fn = getattr(self._cdll, name)  # AttributeError: the header declares what the library lacks
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name[len(PREFIX):], fn)
        self.isa_code = int(self._cdll.eagle_trt_isa())  # 3 AMX, 2 AVX-512, 1 AVX2 + FMA, 0 none of them

    @property
    def isa_name(self) -> str | None:
        """amx, avx512 or avx2: what this build runs on this CPU; None for a build without AVX2 + FMA."""
        return BACKENDS.get(self.isa_code)
