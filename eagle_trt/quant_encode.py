"""Float weights quantized into rows of ggml blocks (the HF -> quantized build path).

    from eagle_trt.quant_encode import quantize_rows
    qt = quantize_rows(w, "q8_0")          # w: [out_features, in_features] float; qt.data uint8 [out_features, ...]

Each block is quantized exactly as ggml's reference quantizers (ggml-quants.c `quantize_row_*_ref`) and gguf-py's
`gguf.quants.quantize` do it, in float32, so the bytes equal theirs (tests/test_gguf_blocks.py). Formats:
q8_0, q4_0, q4_1, q5_0, q5_1, q4_k (`quant_k.py`: as `llama-quantize` makes it without an importance matrix),
and the float ones (f32, f16, bf16). q5_k and q6_k are not made here (they come from a GGUF as they are).
"""

from __future__ import annotations

import torch

from eagle_trt.errors import ConfigError
from eagle_trt.quant_blocks import BLOCKS, QuantTensor, row_layout
from eagle_trt.quant_k import quantize_q4_k


def _round_away(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero (C's roundf), without the float error of floor(|x| + 0.5)."""
    a = x.abs()
    floored = torch.floor(a)
    return torch.sign(x) * (floored + torch.floor(2 * (a - floored)))


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _f16_bytes(d: torch.Tensor) -> torch.Tensor:
    """[n, 1] float32 -> [n, 2] bytes of its fp16 (round to nearest even)."""
    return d.half().view(torch.uint8)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[n, 32] ints 0..15 -> [n, 16] bytes: weight j in the low nibble of byte j, weight j+16 in the high one."""
    return (q[:, :16] | (q[:, 16:] << 4)).to(torch.uint8)


def _pack_high_bits(q: torch.Tensor) -> torch.Tensor:
    """[n, 32] ints 0..31 -> [n, 4] bytes of a little-endian uint32 whose bit j is bit 4 of weight j."""
    bits = ((q >> 4) & 1).reshape(-1, 4, 8) << torch.arange(8, dtype=torch.int32)
    return bits.sum(dim=2).to(torch.uint8)


def _signed_absmax(x: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude in each block, sign kept (the first of equals), [n, 1]."""
    return torch.gather(x, 1, x.abs().argmax(dim=1, keepdim=True))


def _q8_0(x):
    d = x.abs().amax(dim=1, keepdim=True) / 127
    q = _round_away(x * _inverse(d)).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(d), q], dim=1)


def _q4_0(x):
    d = _signed_absmax(x) / -8
    q = torch.trunc(x * _inverse(d) + 8.5).clamp(0, 15).to(torch.int32)
    return torch.cat([_f16_bytes(d), _pack_nibbles(q)], dim=1)


def _q4_1(x):
    lo, hi = x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
    d = (hi - lo) / 15
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).clamp(0, 15).to(torch.int32)
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], dim=1)


def _q5_0(x):
    d = _signed_absmax(x) / -16
    q = torch.trunc(x * _inverse(d) + 16.5).clamp(0, 31).to(torch.int32)
    return torch.cat([_f16_bytes(d), _pack_high_bits(q), _pack_nibbles(q & 0xF)], dim=1)


def _q5_1(x):
    lo, hi = x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
    d = (hi - lo) / 31
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).clamp(0, 31).to(torch.int32)
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _pack_high_bits(q), _pack_nibbles(q & 0xF)], dim=1)


def _bf16(x):
    # ggml_compute_fp32_to_bf16: NaN made quiet, otherwise round to nearest even on the dropped 16 bits.
    n = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    n = torch.where(nan, (n & 0xFFFF0000) | (64 << 16), n)
    n = (n + (0x7FFF + ((n >> 16) & 1))) >> 16
    return (n & 0xFFFF).to(torch.int32).to(torch.int16).view(torch.uint8)


_QUANT = {
    "q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1, "q4_k": quantize_q4_k, "bf16": _bf16,
    "f32": lambda x: x.view(torch.uint8), "f16": lambda x: x.half().view(torch.uint8),
}
QUANTIZABLE = tuple(_QUANT)


def quantize_rows(w: torch.Tensor, format: str) -> QuantTensor:
    """`w` (1-D, or 2-D [out_features, in_features]) as rows of `format` blocks; in_features must be a whole
    number of blocks."""
    if format not in _QUANT:
        raise ConfigError(f"cannot quantize weights to {format!r}; eagle-trt quantizes to {', '.join(QUANTIZABLE)}"
                          + (" (these k-quants come from a GGUF file as they are)" if format in BLOCKS else ""))
    shape = tuple(w.shape)
    rows, row_bytes = row_layout(format, shape) if 1 <= len(shape) <= 2 else (0, 0)
    if not rows:
        raise ConfigError(f"cannot quantize a {len(shape)}-D weight of shape {shape}; only 1-D and 2-D weights")
    n, _ = BLOCKS[format]
    blocks = w.detach().to(torch.float32).contiguous().reshape(-1, n)
    return QuantTensor(format, shape, _QUANT[format](blocks).reshape(rows, row_bytes).contiguous())
