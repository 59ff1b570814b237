"""Projections over GGUF block weights on the compiled kernels (`csrc/gemm_blocks.cpp`), each output row a function
of that row of x alone.

The weight is one self-describing uint8 buffer (`pack`): a header of int64 words (magic, in, out, the segment count,
then per segment its ggml type id, rows, bytes per row and byte offset) and each segment's rows of blocks, 64-byte
aligned. The same buffer is what the one-call forwards receive for a projection (kernel code 2) and what the runtime
weight cache stores; it depends on no CPU feature.

    proj = BlockProjection(lib, block_weights.quantize(w, "q8_0"))   # w [out, in]
    y = proj(x)                                                      # x [M, in] fp32 or bf16 -> [M, out], same dtype
"""

from __future__ import annotations

import torch

from eagle_trt.models.block_weights import FORMATS, BlockWeight
from eagle_trt.models.native import int8_gemm, ops

MAGIC = 0x314B4C4250525445  # "ETRPBLK1" little-endian (kMagic in csrc/gemm_blocks.cpp)
MAX_SEGMENTS = 4
HEADER_WORDS = 8 + 4 * MAX_SEGMENTS
KERNEL = 2  # the one-call forwards' code for block weights (csrc/stack_common.h)
_ALIGN = 64
COMPUTE = ("float", "int8")  # how a block projection computes (BlockProjection)
_FLOATS = (torch.float32, torch.bfloat16)


def pack(w: BlockWeight) -> torch.Tensor:
    """The kernel's buffer for a block weight (see the module docstring)."""
    if len(w.segments) > MAX_SEGMENTS:
        raise ValueError(f"a block weight holds at most {MAX_SEGMENTS} segments, got {len(w.segments)}")
    header = [MAGIC, w.in_features, w.out_features, len(w.segments), 0, 0, 0, 0]
    offset = HEADER_WORDS * 8
    for s in w.segments:
        offset = (offset + _ALIGN - 1) // _ALIGN * _ALIGN
        header += [FORMATS[s.format], s.rows, s.data.shape[1], offset]
        offset += s.data.numel()
    header += [0] * (HEADER_WORDS - len(header))
    buf = torch.zeros(offset, dtype=torch.uint8)
    buf[:HEADER_WORDS * 8] = torch.tensor(header, dtype=torch.int64).view(torch.uint8)
    for i, s in enumerate(w.segments):
        at = header[8 + 4 * i + 3]
        buf[at:at + s.data.numel()] = s.data.reshape(-1)
    return buf


def header_of(buf: torch.Tensor) -> list[int]:
    """The int64 words of a buffer's header (ValueError for one too short or without the magic)."""
    if buf.dtype is not torch.uint8 or buf.dim() != 1 or buf.numel() < HEADER_WORDS * 8:
        raise ValueError("not a block-weight buffer")
    words = buf[:HEADER_WORDS * 8].clone().view(torch.int64).tolist()
    if words[0] not in (MAGIC, int8_gemm.MAGIC):
        raise ValueError("not a block-weight buffer (no magic)")
    return words


class BlockProjection:
    """y = x @ W^T for a block weight; `w` is the packed buffer (the bytes a call streams). Activations fp32 or bf16,
    the output in theirs. `compute`: "float" (each weight row de-quantized to fp32, fp32 products) or "int8" (the
    activations quantized to int8 blocks, integer block dot products: `int8_gemm`); a weight with a format the int8
    path lacks computes in float whatever was asked (`self.compute` says which)."""

    __slots__ = ("lib", "w", "in_features", "out_features", "formats", "compute")
    amx = False
    kernel = KERNEL

    def __init__(self, lib, weight: BlockWeight, compute: str = "float"):
        if compute not in COMPUTE:
            raise ValueError(f"block compute is one of {', '.join(COMPUTE)}, not {compute!r}")
        self.lib, self.in_features, self.out_features = lib, weight.in_features, weight.out_features
        self.formats = weight.formats
        self.compute = "int8" if compute == "int8" and int8_gemm.supports(weight) else "float"
        self.w = int8_gemm.pack(lib, weight) if self.compute == "int8" else pack(weight)

    @classmethod
    def from_packed(cls, lib, buf: torch.Tensor, in_features: int, out_features: int) -> "BlockProjection":
        """A projection over a buffer `pack` made (mapped from the runtime weight cache): nothing is copied."""
        words = header_of(buf)
        if words[1] != in_features or words[2] != out_features:
            raise ValueError(f"a block buffer for [{words[2]}, {words[1]}] does not fit [{out_features}, "
                             f"{in_features}]")
        names = {v: k for k, v in FORMATS.items()}
        self = cls.__new__(cls)
        self.lib, self.w, self.in_features, self.out_features = lib, buf, in_features, out_features
        self.formats = [names.get(words[8 + 4 * i], "?") for i in range(words[3])]
        self.compute = "int8" if words[0] == int8_gemm.MAGIC else "float"
        return self

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] -> [M, out] in x's dtype (into `out` if given)."""
        if x.dtype not in _FLOATS or x.dim() != 2 or not x.is_cpu:
            raise TypeError(f"block projections take a 2-D fp32 or bf16 CPU input, got {x.dtype} {list(x.shape)}")
        if x.shape[1] != self.in_features:
            raise ValueError(f"input has {x.shape[1]} features; the weight takes {self.in_features}")
        x = x.contiguous()
        m = x.shape[0]
        out = ops.out_buffer(out, (m, self.out_features), x.dtype)
        if m == 0:
            return out
        rc = self.lib.blocks_gemm(x.data_ptr(), self.w.data_ptr(), out.data_ptr(), m, self.in_features,
                                  self.out_features, ops.is_bf16(x), torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"block projection failed (code {rc}) for x {list(x.shape)}, {self.out_features} "
                               "outputs")
        return out

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        return ops.argmax(self.lib, self(x))

    def dequantized(self) -> torch.Tensor:
        """The fp32 [out, in] weight the float kernel computes with (its de-quantization, for tests)."""
        if self.compute != "float":
            raise ValueError("an int8-layout weight has no de-quantized form here; build it with compute='float'")
        out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        rc = self.lib.blocks_dequant(self.w.data_ptr(), out.data_ptr(), self.in_features, self.out_features)
        if rc != 0:
            raise RuntimeError(f"block de-quantization failed (code {rc})")
        return out

    @property
    def rows_per_pass(self) -> int:
        """Every row of a call shares one pass over the weight (each weight row is de-quantized once per call)."""
        return 1 << 30
