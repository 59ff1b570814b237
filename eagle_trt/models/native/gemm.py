"""Projections `y = x @ W` on the compiled kernels, each output row a function of that row of x alone.

Two kernels, one face (`NativeProjection`):
- `csrc/gemm_simd.cpp` (AVX2 + FMA or AVX-512): fp32 weights, or bf16-stored weights computed in fp32; every output
  element one chain of fused multiply-adds over the input in order, whatever the row count or thread count;
- `csrc/gemm_amx.cpp` (AMX tiles, bf16): every element one chain of tile multiply-adds over the input in blocks of
  32; it also fuses the LM head with the greedy argmax.

    proj = NativeProjection(lib, w, amx=False)     # w [in, out], fp32 or bf16; packed once
    y = proj(x)                                    # x [M, in] in w's dtype -> [M, out]
"""

from __future__ import annotations

import torch

from eagle_trt.models.native import ops

BF16 = torch.bfloat16
_FLOATS = (torch.float32, BF16)
ARGMAX_ROWS = 16  # rows one pass of the AMX kernel's fused argmax takes (csrc/gemm_amx.cpp)
AMX_ROWS = 32     # rows the AMX kernel multiplies in one pass over a weight
SIMD_ROWS = 64    # rows the vector kernel multiplies in one pass over a weight (kSuperRows in csrc/gemm_simd.cpp)


def amx_packed_size(k: int, n: int) -> int:
    """Elements of a [k, n] weight in the AMX layout: columns padded to 32-column groups (csrc/gemm_amx.cpp)."""
    return (n + 31) // 32 * 32 * k


def amx_fits(k: int) -> bool:
    """The AMX kernel takes inputs whose size is a multiple of its 32-element K block."""
    return k % 32 == 0


class NativeProjection:
    """y = x @ W for a weight packed for one of the compiled kernels. `w` is the packed weight (the bytes a call
    streams); `in_features` and `out_features` its shape."""

    __slots__ = ("lib", "w", "in_features", "out_features", "dtype", "amx")

    def __init__(self, lib, weight: torch.Tensor, amx: bool = False):
        if weight.dim() != 2 or weight.dtype not in _FLOATS or weight.device.type != "cpu":
            raise TypeError(f"native projections take a 2-D fp32 or bf16 CPU weight, got {weight.dtype} "
                            f"{list(weight.shape)} on {weight.device}")
        k, n = weight.shape
        if amx and (weight.dtype is not BF16 or not amx_fits(k)):
            raise ValueError(f"AMX projections take a bf16 [in, out] weight with in a multiple of 32, got "
                             f"{weight.dtype} {list(weight.shape)}")
        self.lib, self.in_features, self.out_features, self.dtype, self.amx = lib, k, n, weight.dtype, amx
        weight = weight.contiguous()
        if amx:
            self.w = torch.empty(amx_packed_size(k, n), dtype=BF16)
            rc = lib.amx_pack(weight.data_ptr(), self.w.data_ptr(), k, n)
        else:
            self.w = torch.empty(lib.gemm_packed_size(k, n, int(weight.dtype is BF16)), dtype=weight.dtype)
            rc = lib.gemm_pack(weight.data_ptr(), self.w.data_ptr(), k, n, int(weight.dtype is BF16))
        if rc != 0:
            raise RuntimeError(f"packing a {list(weight.shape)} weight failed (code {rc})")

    @classmethod
    def from_packed(cls, lib, packed: torch.Tensor, in_features: int, out_features: int, amx: bool
                    ) -> "NativeProjection":
        """A projection over a weight already in its kernel's layout (what `w` held, e.g. mapped from the runtime
        weight cache): nothing is packed or copied."""
        size = amx_packed_size(in_features, out_features) if amx else lib.gemm_packed_size(
            in_features, out_features, int(packed.dtype is BF16))
        fits = packed.dim() == 1 and packed.numel() == size and packed.dtype in _FLOATS
        if not fits or (amx and packed.dtype is not BF16):
            raise ValueError(f"a packed {list(packed.shape)} {packed.dtype} weight does not fit [{in_features}, "
                             f"{out_features}] (amx={amx})")
        self = cls.__new__(cls)
        self.lib, self.w, self.in_features, self.out_features = lib, packed, in_features, out_features
        self.dtype, self.amx = packed.dtype, amx
        return self

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] -> [M, out] in the weight's dtype (into `out` if given: a buffer a forward reuses)."""
        x = self._checked(x)
        m = x.shape[0]
        out = ops.out_buffer(out, (m, self.out_features), self.dtype)
        if m == 0:
            return out
        threads = torch.get_num_threads()
        if self.amx:
            rc = self.lib.amx_gemm(x.data_ptr(), self.w.data_ptr(), out.data_ptr(), m, self.in_features,
                                   self.out_features, threads)
        else:
            rc = self.lib.gemm(x.data_ptr(), self.w.data_ptr(), out.data_ptr(), m, self.in_features,
                               self.out_features, int(self.dtype is BF16), threads)
        if rc != 0:
            raise RuntimeError(f"native projection failed (code {rc}) for x {list(x.shape)}, {self.out_features} "
                               "outputs")
        return out

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """torch.argmax(self(x), dim=-1): the AMX kernel keeps a running argmax instead of writing the product (16
        rows a pass); the vector kernel writes the product and the row-ops kernel reads it."""
        if not self.amx:
            return ops.argmax(self.lib, self(x))
        x = self._checked(x)
        m = x.shape[0]
        out = torch.empty(m, dtype=torch.int64)
        for r in range(0, m, ARGMAX_ROWS):
            rows = min(ARGMAX_ROWS, m - r)
            rc = self.lib.amx_gemm_argmax(x[r].data_ptr(), self.w.data_ptr(), out[r].data_ptr(), rows,
                                          self.in_features, self.out_features, torch.get_num_threads())
            if rc != 0:
                raise RuntimeError(f"AMX argmax failed (code {rc}) for x {list(x.shape)}")
        return out

    @property
    def kernel(self) -> int:
        """The one-call forwards' code for this weight's layout (csrc/stack_common.h): 1 AMX tiles, 0 vectors."""
        return int(self.amx)

    @property
    def rows_per_pass(self) -> int:
        """Rows one call multiplies in a single pass over the weight."""
        return AMX_ROWS if self.amx else SIMD_ROWS

    def _checked(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype is not self.dtype or x.dim() != 2 or not x.is_cpu:
            raise TypeError(f"this projection takes a 2-D {self.dtype} CPU input, got {x.dtype} {list(x.shape)}")
        if x.shape[1] != self.in_features:
            raise ValueError(f"input has {x.shape[1]} features; the weight takes {self.in_features}")
        return x.contiguous()
