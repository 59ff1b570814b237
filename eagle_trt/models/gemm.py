"""Fixed-weight projections `y = x @ W` with the fastest CPU kernel for the dtype and the number of rows.

Profiled on the project machine (`python scripts/kernel_timings.py --threads 2`: SmolLM2's [576, 3072],
30 distinct weights so nothing stays in cache):

| kernel                          | fp32, 1 row | fp32, 16 rows | bf16, 1 row | bf16, 16 rows |
|---------------------------------|-------------|---------------|-------------|---------------|
| `x @ W` (W stored [in, out])    | 0.19 ms     | 0.70-0.75 ms  | 0.22 ms     | 0.18-0.27 ms  |
| oneDNN, weight prepacked once   | 0.28 ms     | 0.44 ms       | 0.11 ms     | 0.11 ms       |

So a plain GEMM serves fp32 decoding (one row), and a weight prepacked for oneDNN serves tree
verification (many rows). Prepacking copies the weight, so fp32 keeps both layouts (about twice the weight
memory). Where oneDNN is missing (other builds, GPU tensors) every call is a plain `x @ W`.

bf16 weights go to the AMX kernel (models/native_gemm.py) on CPUs that have AMX and a C++ compiler: every output
row a function of its input row at any row count, and a whole layer's projections about a quarter faster than
oneDNN's at 1 to 32 rows (`kernel_timings.py` prints both). Elsewhere bf16 takes oneDNN's prepacked kernel, which
up to 32 rows computes each output row independently of how many rows are in the call; larger calls are split into
32-row chunks (tests/test_gemm.py checks both). Either way a T-token verify forward gives the same bits as T
one-token forwards.
"""

from __future__ import annotations

import os

import torch

from eagle_trt.models import native_gemm

# Row count the packed layout is tuned for (the default tree verifies 16 tokens plus the root).
PACK_ROWS = 16
_PACKABLE = (torch.float32, torch.bfloat16)
# Largest call whose rows the packed bf16 kernel computes independently of the row count (measured with
# oneDNN 3.12 in torch 2.13: 1..32 rows agree bit for bit, 33 and more take another kernel).
INVARIANT_ROWS = 32


def prepack_enabled() -> bool:
    """oneDNN prepacking is on unless EAGLE_TRT_PREPACK=0 (for A/B timing) or this torch lacks oneDNN."""
    if os.environ.get("EAGLE_TRT_PREPACK", "1") == "0":
        return False
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class Projection:
    """y = x @ W for W [in, out] (stored transposed from the checkpoint's [out, in])."""

    __slots__ = ("w", "packed", "single_row_packed", "amx", "amx_kernel")

    def __init__(self, w: torch.Tensor, prepack: bool | None = None, amx: bool = True):
        self.w = w
        self.packed = None
        self.single_row_packed = False
        self.amx = None  # the weight in the AMX kernel's tile layout (bf16 on CPUs with AMX)
        self.amx_kernel = None
        if prepack is None:
            prepack = prepack_enabled()
        # amx=False keeps a bf16 weight on oneDNN (for timing the two side by side).
        kernel = native_gemm.load() if prepack and amx and w.dtype == torch.bfloat16 else None
        if kernel is not None and kernel.supports(w):
            self.amx, self.amx_kernel = kernel.pack(w), kernel
            return
        if prepack and w.device.type == "cpu" and w.dtype in _PACKABLE and w.dim() == 2:
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), PACK_ROWS)
                probe = torch.ones(2, w.shape[0], dtype=w.dtype)
                torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
                self.packed = packed
                # bf16: the packed kernel is also the fast one for a single row.
                self.single_row_packed = w.dtype == torch.bfloat16
            except (RuntimeError, NotImplementedError):
                self.packed = None

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] -> [M, out]. `out`: a buffer the AMX kernel may write into (use the return value)."""
        if self.amx is not None and x.dim() == 2:
            return self.amx_kernel(x, self.amx, self.w.shape[1], out)
        if self.packed is None or x.dim() != 2 or (x.shape[0] == 1 and not self.single_row_packed):
            return x @ self.w
        x = x.contiguous()
        if self.single_row_packed and x.shape[0] > INVARIANT_ROWS:
            # Above 32 rows oneDNN switches to a kernel whose rows differ in the last bit from the small-call
            # kernel's; chunking keeps every bf16 row on the one kernel that decoding also uses.
            return torch.cat([self._packed(c) for c in x.split(INVARIANT_ROWS)])
        return self._packed(x)

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """torch.argmax(self(x), dim=-1), from the AMX kernel without writing the product where it serves this
        weight, else from the product."""
        if self.amx is not None and x.dim() == 2 and x.dtype == torch.bfloat16:
            return self.amx_kernel.argmax(x, self.amx, self.w.shape[1])
        return self(x).argmax(dim=-1)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX tiles or AVX512-BF16); without it, bf16 GEMMs
    are emulated and run far slower than fp32 (~300x was seen on an AVX2-only machine)."""
    import torch.cpu

    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        fn = getattr(torch.cpu, probe, None)
        try:
            if fn is not None and fn():
                return True
        except RuntimeError:
            continue
    return False
