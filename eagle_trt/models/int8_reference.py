"""The torch reference of the block projections with int8 activations (`csrc/int8_blocks.h` states the formula):
each activation row quantized row-locally to int8 blocks, exact integer block dot products from the GGUF codes, then
the fixed fp32 step per block and output, in k order. The integer parts equal the kernel's exactly; the fp32 fma is
taken in float64 and rounded once more, so a result may differ from the kernel's in the last fp32 bit (a double
rounding) and nowhere else. Every row of a call is its own computation: a verify row equals decoding it alone.

    ref = Int8Reference(block_weights.quantize(w, "q4_0"))
    y = ref(x)                                    # x [M, in] fp32 or bf16 -> [M, out] in x's dtype
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_trt.models.block_weights import BlockWeight, Segment
from eagle_trt.quant_blocks import _f16, _high_bits, _nibbles, _scale_min_k4

FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k")
# Weights per activation block (Q32 or Q256) and per scaled sub-block of each format.
ACT_BLOCK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q4_k": 256, "q6_k": 256}
SUB = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q4_k": 32, "q6_k": 16}


def supports(w: BlockWeight) -> bool:
    return all(s.format in FORMATS for s in w.segments)


def quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 -> (a int32 [M, K] in [-127, 127], da fp32 [M, K / block]): amax = max |x| per block,
    a = round_half_even(x * (127 / amax)), da = amax / 127 (zeros where amax is 0), every step in fp32."""
    m, k = x.shape
    xb = x.float().reshape(m, k // block, block)
    amax = xb.abs().amax(dim=-1)
    # A true division (a Python number over a tensor is its reciprocal times the number: two roundings).
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    return torch.round(xb * inv.unsqueeze(-1)).to(torch.int32).reshape(m, k), amax / 127.0


@dataclass(frozen=True)
class _Codes:
    """One segment's weights as integers: q [N, K] with the format's offset removed (q8_0's signed codes, q4_0's
    q - 8, q5_0's q - 16, q6_k's q - 32; q4_k's and q4_1's raw codes), d [N, blocks], sc [N, K / SUB] (1 for the
    32-blocks), q4_k's dmin [N, blocks] and m [N, K / 32], and q4_1's additive minimum add [N, blocks]."""

    format: str
    q: torch.Tensor
    d: torch.Tensor
    sc: torch.Tensor
    dmin: torch.Tensor | None = None
    m: torch.Tensor | None = None
    add: torch.Tensor | None = None


def _codes(fmt: str, data: torch.Tensor, k: int) -> _Codes:
    n = data.shape[0]
    b = data.reshape(-1, data.shape[1] // (k // (256 if fmt in ("q4_k", "q6_k") else 32)))
    if fmt == "q8_0":
        q, d, sc = b[:, 2:34].view(torch.int8).to(torch.int32), _f16(b, 0), None
    elif fmt == "q4_0":
        q, d, sc = _nibbles(b[:, 2:18], 16) - 8, _f16(b, 0), None
    elif fmt == "q4_1":
        q = _nibbles(b[:, 4:20], 16)
        return _Codes(fmt, q.reshape(n, k), _f16(b, 0).reshape(n, -1), torch.ones(n, k // 32, dtype=torch.int32),
                      add=_f16(b, 2).reshape(n, -1))
    elif fmt == "q5_0":
        q, d, sc = (_nibbles(b[:, 6:22], 16) | (_high_bits(b[:, 2:6], 32) << 4)) - 16, _f16(b, 0), None
    elif fmt == "q4_k":
        sc, mn = _scale_min_k4(b[:, 4:16])
        q = _nibbles(b[:, 16:144], 32)
        return _Codes(fmt, q.reshape(n, k), _f16(b, 0).reshape(n, -1), sc.to(torch.int32).reshape(n, -1),
                      _f16(b, 2).reshape(n, -1), mn.to(torch.int32).reshape(n, -1))
    else:  # q6_k, ggml's bit layout (as quant_blocks._q6_k reads it)
        ql = b[:, 0:128].to(torch.int32).reshape(-1, 2, 1, 64)
        ql = torch.cat([ql & 0xF, ql >> 4], dim=2).reshape(-1, 8, 32)
        qh = b[:, 128:192].to(torch.int32).reshape(-1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6]).reshape(1, 1, 4, 1)
        q = (ql | ((qh & 3).reshape(-1, 8, 32) << 4)) - 32
        sc, d = b[:, 192:208].view(torch.int8).to(torch.int32), _f16(b, 208)
    sc = torch.ones(n, k // 32, dtype=torch.int32) if sc is None else sc.reshape(n, -1)
    return _Codes(fmt, q.reshape(n, k), d.reshape(n, -1), sc)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c for fp32 tensors: the product exact in float64, the sum rounded in float64 and then to fp32."""
    return (a.double() * b.double() + c.double()).float()


def _segment(c: _Codes, x: torch.Tensor) -> torch.Tensor:
    """x [M, K] fp32 -> [M, N] fp32 for one segment (the formula of csrc/int8_blocks.h)."""
    m, k = x.shape
    a, da = quantize(x, ACT_BLOCK[c.format])
    sub = SUB[c.format]
    dots = torch.einsum("msk,nsk->mns", a.reshape(m, k // sub, sub).long(), c.q.reshape(-1, k // sub, sub).long())
    blocks = c.d.shape[1]
    i = (dots * c.sc.long()).reshape(m, -1, blocks, k // blocks // sub).sum(-1)  # [M, N, blocks], exact
    if c.m is not None:
        sums = a.reshape(m, k // 32, 32).sum(-1).long()
        j = (sums[:, None, :] * c.m[None].long()).reshape(m, -1, blocks, 8).sum(-1)
    acc = torch.zeros(m, c.q.shape[0], dtype=torch.float32)
    for blk in range(blocks):
        s = c.d[None, :, blk] * da[:, None, blk]
        acc = _fma(s, i[:, :, blk].to(torch.float32), acc)
        if c.m is not None:
            acc = _fma(-(c.dmin[None, :, blk] * da[:, None, blk]), j[:, :, blk].to(torch.float32), acc)
        if c.add is not None:  # q4_1: + m * da times the block's sum of codes
            sums = a.reshape(m, blocks, 32)[:, blk].sum(-1).to(torch.float32)
            acc = _fma(c.add[None, :, blk] * da[:, None, blk], sums[:, None].expand(-1, c.q.shape[0]), acc)
    return acc


class Int8Reference:
    """The reference projection over a block weight with int8 activations (see the module docstring)."""

    __slots__ = ("blocks", "codes")
    compute = "int8"

    def __init__(self, blocks: BlockWeight):
        if not supports(blocks):
            raise ValueError(f"int8 activations take {', '.join(FORMATS)} weights, not {'+'.join(blocks.formats)}")
        self.blocks = blocks
        self.codes = [_codes(s.format, s.data, blocks.in_features) for s in blocks.segments]

    @property
    def in_features(self) -> int:
        return self.blocks.in_features

    @property
    def out_features(self) -> int:
        return self.blocks.out_features

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[0] == 0:
            return x.new_empty(0, self.out_features)
        y = torch.cat([_segment(c, x.float()) for c in self.codes], dim=1)
        return y.to(x.dtype)

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).argmax(dim=-1)

    # ---- the runtime weight cache: the segments' GGUF rows, one after another -----------------------------------
    def state(self) -> tuple[torch.Tensor, dict]:
        buf = torch.cat([s.data.reshape(-1) for s in self.blocks.segments])
        segs = [[s.format, s.rows, s.data.shape[1]] for s in self.blocks.segments]
        return buf, {"in": self.in_features, "out": self.out_features, "int8_segments": segs}

    @classmethod
    def from_state(cls, buf: torch.Tensor, meta: dict) -> "Int8Reference":
        segs, at = [], 0
        for fmt, rows, row_bytes in meta["int8_segments"]:
            segs.append(Segment(fmt, buf[at:at + rows * row_bytes].view(rows, row_bytes)))
            at += rows * row_bytes
        return cls(BlockWeight(tuple(segs), meta["in"]))
