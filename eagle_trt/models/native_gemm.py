"""bf16 projections on Intel AMX tiles (`csrc/gemm_amx.cpp`, built by `native.py`).

Each output row is a function of that row of x alone at any row count, so a verify pass's projections give the
same bits as decoding each token alone without the 32-row chunking oneDNN needs; and it streams each weight once
for up to 32 rows. `Projection` (models/gemm.py) uses it for bf16 weights whose input size is a multiple of 32 on
CPUs with AMX; elsewhere (no AMX, no compiler, EAGLE_TRT_NATIVE=0) `load()` returns None and oneDNN serves.
"""

from __future__ import annotations

import ctypes

import torch

from eagle_trt.models import native


ARGMAX_ROWS = 16  # rows one pass of the fused argmax takes (csrc/gemm_amx.cpp)


def packed_size(k: int, n: int) -> int:
    """Elements of the packed [k, n] weight: columns padded to the kernel's 32-column groups (csrc/gemm_amx.cpp)."""
    return (n + 31) // 32 * 32 * k


class AmxGemm:
    def __init__(self, lib: ctypes.CDLL):
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        self._pack = lib.eagle_trt_amx_pack
        self._pack.argtypes, self._pack.restype = [ptr, ptr, i64, i64], i32
        self._gemm = lib.eagle_trt_amx_gemm
        self._gemm.argtypes, self._gemm.restype = [ptr, ptr, ptr, i64, i64, i64, i32], i32
        self._argmax = lib.eagle_trt_amx_gemm_argmax
        self._argmax.argtypes, self._argmax.restype = [ptr, ptr, ptr, i64, i64, i64, i32], i32

    @staticmethod
    def supports(w: torch.Tensor) -> bool:
        """A bf16 [in, out] CPU weight with `in` a multiple of 32 (the kernel's K block)."""
        return w.dtype == torch.bfloat16 and w.device.type == "cpu" and w.dim() == 2 and w.shape[0] % 32 == 0

    def pack(self, w: torch.Tensor) -> torch.Tensor:
        """w [in, out] bf16 -> the kernel's tile layout (a flat bf16 tensor)."""
        if not self.supports(w):
            raise ValueError(f"AMX projections take a bf16 [in, out] weight with in a multiple of 32, got "
                             f"{w.dtype} {list(w.shape)}")
        w = w.contiguous()
        k, n = w.shape
        packed = torch.empty(packed_size(k, n), dtype=torch.bfloat16)
        if self._pack(w.data_ptr(), packed.data_ptr(), k, n) != 0:
            raise RuntimeError(f"AMX weight packing failed for shape {list(w.shape)}")
        return packed

    def __call__(self, x: torch.Tensor, packed: torch.Tensor, out_features: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] bf16 -> [M, out_features], into `out` if given (a forward reuses one buffer per projection
        across its layers; `native.out_buffer`)."""
        x, m, k = _checked(x, packed, out_features)
        out = native.out_buffer(out, (m, out_features), torch.bfloat16)
        if m == 0:
            return out
        rc = self._gemm(x.data_ptr(), packed.data_ptr(), out.data_ptr(), m, k, out_features, torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"AMX projection failed (code {rc}) for x {list(x.shape)}, {out_features} outputs")
        return out

    def argmax(self, x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
        """x [M, in] bf16 -> [M] int64: torch.argmax of each row of `self(x, packed, out_features)`, without
        writing those rows (a greedy step reads nothing else of the LM head's logits). Any M: 16 rows a pass."""
        x, m, k = _checked(x, packed, out_features)
        out = torch.empty(m, dtype=torch.int64)
        for r in range(0, m, ARGMAX_ROWS):
            rows = min(ARGMAX_ROWS, m - r)
            rc = self._argmax(x[r].data_ptr(), packed.data_ptr(), out[r].data_ptr(), rows, k, out_features,
                              torch.get_num_threads())
            if rc != 0:
                raise RuntimeError(f"AMX argmax failed (code {rc}) for x {list(x.shape)}, {out_features} outputs")
        return out


def _checked(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> tuple[torch.Tensor, int, int]:
    """x as the kernels read it (2-D bf16, contiguous) and its shape; the packed weight must be for its width."""
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise TypeError(f"AMX projections take a 2-D bf16 input, got {x.dtype} {list(x.shape)}")
    x = x.contiguous()
    m, k = x.shape
    if packed.numel() != packed_size(k, out_features):
        raise ValueError(f"input has {k} features; the packed weight is for another shape")
    return x, m, k


def load() -> AmxGemm | None:
    """The AMX kernel (one per process), or None: no AMX on this CPU (or the OS refused the tiles), no compiler,
    or EAGLE_TRT_NATIVE=0 (see `native.library`)."""
    return native.shared(AmxGemm, lambda lib: lib.eagle_trt_amx_available() == 1)
