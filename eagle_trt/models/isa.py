"""Which instruction set the kernels are built for: this CPU's own, or a lower one forced for testing and benchmarks.

    EAGLE_TRT_ISA=avx2 eagle-trt bench ...     # the AVX2 + FMA kernels on any newer x86-64 CPU

`EAGLE_TRT_ISA` is `native` (the default: `-march=native`, AMX where the CPU grants it), `amx` (the same build, and
an error unless the kernels then run AMX), `avx512` (this CPU's instructions without AMX), `avx2`
(`-march=x86-64-v3`: AVX2 + FMA, no AVX-512, no AMX) or `avxvnni` (`avx2` plus AVX-VNNI, the 256-bit integer dot
product the int8 block projections use where a CPU has it without AVX-512). A forced ISA also hides the hardware
bf16 units from `bf16_hardware` (the torch reference's oneDNN bf16 path), so the whole engine behaves as it would on
a CPU that has only those instructions. A value that is not one of these, or names instructions this CPU lacks, is
an InputError (exit 2) that names the valid values and what this CPU has: there is no silent fallback to other
kernels. For torch's own kernels set `ATEN_CPU_CAPABILITY=avx2` and `ONEDNN_MAX_CPU_ISA=AVX2` beside it. Pure logic: no
compiler, no library.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from eagle_trt.errors import InputError

ISAS = ("native", "amx", "avx512", "avxvnni", "avx2")
# The compiler flags that pick each one (GCC >= 11 and Clang >= 12 know all of them).
MARCH = {
    "native": ["-march=native"],
    "amx": ["-march=native"],
    "avx512": ["-march=native", "-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"],
    "avxvnni": ["-march=x86-64-v3", "-mavxvnni", "-mtune=generic"],
    "avx2": ["-march=x86-64-v3", "-mtune=generic"],
}
# What the CPU must have (its /proc/cpuinfo flags) for each forced ISA.
NEEDS = {
    "amx": ("amx_tile", "amx_bf16"),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "avxvnni": ("avx2", "fma", "avx_vnni"),
    "avx2": ("avx2", "fma"),
}
# eagle_trt_isa()'s answer -> the kernels' name (0: a build without AVX2 + FMA, which the engine does not use).
BACKENDS = {3: "amx", 2: "avx512", 1: "avx2"}


def requested() -> str:
    """The ISA EAGLE_TRT_ISA asks for ("native" when unset); an InputError for a value that is not one, or names
    instructions this CPU does not have."""
    raw = os.environ.get("EAGLE_TRT_ISA", "native")
    isa = raw.strip().lower() or "native"
    if isa not in ISAS:
        raise InputError(f"EAGLE_TRT_ISA={raw!r}: expected one of {', '.join(ISAS)} (this CPU has: {available()})")
    flags = cpu_flags()
    missing = [f for f in NEEDS.get(isa, ()) if flags and f not in flags]
    if missing:
        raise InputError(f"EAGLE_TRT_ISA={raw!r}: this CPU lacks {', '.join(missing)} (it has: {available()}); "
                         "unset EAGLE_TRT_ISA or choose one it has")
    return isa


def available() -> str:
    """The forced ISAs this CPU can run, best first ("unknown" where its flags cannot be read)."""
    flags = cpu_flags()
    if not flags:
        return "unknown"
    have = [isa for isa in ("amx", "avx512", "avxvnni", "avx2") if all(f in flags for f in NEEDS[isa])]
    return ", ".join(have) if have else "none of amx, avx512, avx2"


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
    """Whether the forced ISA hides AMX and AVX512-BF16 (avx2 and avxvnni hide both; avx512 hides AMX only)."""
    return (isa or requested()) in ("avx2", "avxvnni")


def check_isa(built: str | None) -> None:
    """EAGLE_TRT_ISA=amx promises AMX: a build whose kernels did not get the tiles (the OS did not grant them) is an
    InputError rather than quietly vector kernels."""
    if requested() == "amx" and built != "amx":
        raise InputError(f"EAGLE_TRT_ISA='amx': the kernels run {built or 'no'} instructions here, not AMX (the CPU "
                         "has the flags, but the tiles were not granted to this process); unset EAGLE_TRT_ISA")


def hides_amx(isa: str | None = None) -> bool:
    return (isa or requested()) in ("avx2", "avxvnni", "avx512")
