"""What the native-kernel tests share: every build of the kernels this machine can run.

The machine's own build (amx, avx512 or avx2) is `native.library()`; on a CPU above AVX2 an AVX2 build
(`-march=x86-64-v3`) is loaded beside it, so the AVX2 kernels are tested everywhere. Without a compiler both are
missing and the tests skip with the reason; EAGLE_TRT_REQUIRE_NATIVE=1 makes that an error instead
(`native.library()` raises).
"""

from __future__ import annotations

import functools

import pytest

from eagle_trt.models import native
from eagle_trt.models.native import bindings, build


@functools.cache
def builds() -> dict:
    """{kernels name: Library} for every kernel build that runs here (empty without a compiler)."""
    lib = native.library()
    if lib is None:
        return {}
    out = {lib.isa_name: lib}
    if lib.isa_name != "avx2":
        out["avx2"] = bindings.Library(build.build(target_isa="avx2"))
    return out


def build_names() -> list[str]:
    return list(builds()) or ["none"]


def lib_or_skip(name: str):
    """The build of that name, or a skip saying why there is none."""
    if name not in builds():
        pytest.skip(f"no native kernels here: {native.unavailable()}")
    return builds()[name]
