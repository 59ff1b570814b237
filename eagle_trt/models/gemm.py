"""The torch reference kernels' projections `y = x @ W`, with the fastest torch kernel for the dtype and rows.

Which torch kernel is fastest depends on dtype and rows (docs/bench.md, "The torch reference's projections"): a
plain GEMM serves fp32 decoding (one row), and a weight prepacked for oneDNN serves tree verification (many rows);
prepacking copies the weight, so fp32 keeps both layouts. bf16 takes oneDNN's prepacked kernel for every call
where the CPU multiplies bf16 in hardware: up to 32 rows it computes each output row independently of how many
rows are in the call, and larger calls are split into 32-row chunks, so a bf16 verify row equals decoding it alone.
Where oneDNN is missing (other builds, GPU tensors) every call is a plain `x @ W`.

The engine's compiled kernels (models/native/) replace all of this on x86-64 CPUs with AVX2 and a C++ compiler.
"""

from __future__ import annotations

import os

import torch
import torch.cpu

from eagle_trt.models import isa

# Row count the packed layout is tuned for (the default tree verifies 16 tokens plus the root).
PACK_ROWS = 16
_PACKABLE = (torch.float32, torch.bfloat16)
# Largest call whose rows the packed bf16 kernel computes independently of the row count: 1..32 rows agree bit for
# bit, 33 and more take another kernel (tests/test_gemm.py checks it on the torch installed).
INVARIANT_ROWS = 32


def prepack_enabled() -> bool:
    """oneDNN prepacking is on unless EAGLE_TRT_PREPACK=0 (for A/B timing) or this torch lacks oneDNN."""
    if os.environ.get("EAGLE_TRT_PREPACK", "1") == "0":
        return False
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class Projection:
    """y = x @ W for W [in, out] (stored transposed from the checkpoint's [out, in])."""

    __slots__ = ("w", "packed", "single_row_packed")

    def __init__(self, w: torch.Tensor, prepack: bool | None = None):
        self.w = w
        self.packed = None
        self.single_row_packed = False
        if prepack is None:
            prepack = prepack_enabled()
        if prepack and w.device.type == "cpu" and w.dtype in _PACKABLE and w.dim() == 2 and (
                w.dtype == torch.float32 or bf16_hardware()):
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), PACK_ROWS)
                probe = torch.ones(2, w.shape[0], dtype=w.dtype)
                torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
                self.packed = packed
                # bf16: the packed kernel is also the fast one for a single row.
                self.single_row_packed = w.dtype == torch.bfloat16
            except (RuntimeError, NotImplementedError):
                self.packed = None

    @property
    def in_features(self) -> int:
        return self.w.shape[0]

    @property
    def out_features(self) -> int:
        return self.w.shape[1]

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] -> [M, out] (`out` is accepted for the native projections' signature and not used)."""
        if self.packed is None or x.dim() != 2 or (x.shape[0] == 1 and not self.single_row_packed):
            return x @ self.w
        x = x.contiguous()
        if self.single_row_packed and x.shape[0] > INVARIANT_ROWS:
            # Above 32 rows oneDNN switches to a kernel whose rows differ in the last bit from the small-call
            # kernel's; chunking keeps every bf16 row on the one kernel that decoding also uses.
            return torch.cat([self._packed(c) for c in x.split(INVARIANT_ROWS)])
        return self._packed(x)

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).argmax(dim=-1)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


def bf16_hardware() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX tiles or AVX512-BF16) for torch's kernels, as far as
    EAGLE_TRT_ISA lets the engine see (`models/isa.py`)."""
    if isa.hides_bf16_hardware():
        return False
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        fn = getattr(torch.cpu, probe, None)
        try:
            if fn is not None and fn():
                return True
        except RuntimeError:
            continue
    return False
