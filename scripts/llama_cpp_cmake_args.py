"""The CMake arguments `make llama-cpp` builds llama.cpp (inside llama-cpp-python) with, for this CPU.

    CMAKE_ARGS="$(python scripts/llama_cpp_cmake_args.py)" pip install --no-binary llama-cpp-python ...

Everywhere: GGML_NATIVE, this CPU's own instructions. On a CPU with AMX-INT8 tiles, every one of its vector
extensions but not the tiles: ggml's AMX matrix product crashes there (a segmentation fault in
ggml_backend_amx_mul_mat at the first prompt, for Q4_1, Q4_K_M and others; llama.cpp issue #20824, closed unfixed)
for llama.cpp 0c1e570 in llama-cpp-python 0.3.36, and -march=native cannot be combined with -mno-amx-* through
CMAKE_C_FLAGS (ggml puts -march=native after them). Decoding one token does not use the tiles in llama.cpp, so
plain decoding is llama.cpp's either way; its batched products (prompt, speculative verify) then run AVX512-VNNI.
"""

from __future__ import annotations

from pathlib import Path

# ggml's CMake option -> the /proc/cpuinfo flag it needs.
EXTENSIONS = {
    "GGML_SSE42": "sse4_2", "GGML_F16C": "f16c", "GGML_FMA": "fma", "GGML_BMI2": "bmi2", "GGML_AVX": "avx",
    "GGML_AVX2": "avx2", "GGML_AVX_VNNI": "avx_vnni", "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi",
    "GGML_AVX512_VNNI": "avx512_vnni", "GGML_AVX512_BF16": "avx512_bf16",
}


def cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cmake_args(flags: set[str]) -> str:
    if "amx_int8" not in flags:
        return "-DGGML_NATIVE=ON"
    on = [opt for opt, flag in EXTENSIONS.items() if flag in flags]
    return " ".join(["-DGGML_NATIVE=OFF", *(f"-D{opt}=ON" for opt in on),
                     "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"])


def main() -> None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    print(cmake_args(cpu_flags(text)))


if __name__ == "__main__":
    main()
