"""Which instruction set the kernels are built for: this CPU's own, or a lower one forced for testing and benchmarks.

    EAGLE_TRT_ISA=avx2 eagle-trt bench ...     # the AVX2 + FMA kernels on any newer x86-64 CPU

`EAGLE_TRT_ISA` is `native` (the default: `-march=native`, AMX where the CPU grants it), `avx512` (this CPU's
instructions without AMX) or `avx2` (`-march=x86-64-v3`: AVX2 + FMA, no AVX-512, no AMX). A forced ISA also hides
the hardware bf16 units from `bf16_hardware` (the torch reference's oneDNN bf16 path), so the whole engine behaves
as it would on a CPU that has only those instructions. It can only lower the ISA: `avx512` on an AVX2-only CPU
builds for AVX2. For torch's own kernels set `ATEN_CPU_CAPABILITY=avx2` and `ONEDNN_MAX_CPU_ISA=AVX2` beside it.
Pure logic: no compiler, no library.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

ISAS = ("native", "avx512", "avx2")
# The compiler flags that pick each one (GCC >= 11 and Clang >= 12 know all of them).
MARCH = {
    "native": ["-march=native"],
    "avx512": ["-march=native", "-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"],
    "avx2": ["-march=x86-64-v3", "-mtune=generic"],
}
# eagle_trt_isa()'s answer -> the backend's name (0: a build without AVX2 + FMA, which the engine does not use).
BACKENDS = {3: "amx", 2: "avx512", 1: "avx2"}


def requested() -> str:
    """The ISA EAGLE_TRT_ISA asks for ("native" when unset); ValueError for anything else."""
    isa = os.environ.get("EAGLE_TRT_ISA", "native").strip().lower() or "native"
    if isa not in ISAS:
        raise ValueError(f"EAGLE_TRT_ISA={isa!r}: expected one of {', '.join(ISAS)}")
    return isa


def march_flags(isa: str | None = None) -> list[str]:
    return list(MARCH[isa or requested()])


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_key() -> str:
    """What a -march=native build depends on: the CPU's flags (code built for one CPU must not run on another)."""
    flags = cpu_flags()
    return " ".join(sorted(flags)) if flags else (platform.processor() or platform.machine())


def hides_bf16_hardware(isa: str | None = None) -> bool:
    """Whether the forced ISA hides AMX and AVX512-BF16 (avx2 hides both; avx512 hides AMX only)."""
    return (isa or requested()) == "avx2"


def hides_amx(isa: str | None = None) -> bool:
    return (isa or requested()) in ("avx2", "avx512")
