"""Weights kept as their quantized blocks: the formats, one tensor's rows of blocks, and their exact de-quantization.

    from eagle_trt.quant_blocks import QuantTensor, dequantize, BYTES_PER_256
    qt = QuantTensor("q8_0", (out_features, in_features), data)   # data: uint8 [out_features, bytes_per_row]
    w = dequantize(qt)                                                 # float32 [out_features, in_features]

A row of a 2-D weight is one output feature; its in_features weights are cut into consecutive blocks and each
block is stored in the byte layout of llama.cpp's ggml (ggml-common.h, little-endian), so the bytes a GGUF file
holds are used as they are:

- q8_0 (32 weights, 34 bytes): fp16 d, 32 int8 q; w = q·d.
- q4_0 (32, 18): fp16 d, 16 bytes holding weight j in the low nibble of byte j and weight j+16 in its high
  nibble; w = (q−8)·d.
- q4_1 (32, 20): fp16 d, fp16 m, nibbles as q4_0; w = q·d + m.
- q5_0 (32, 22): fp16 d, a little-endian uint32 qh whose bit j is the 5th bit of weight j, nibbles; w = (q−16)·d.
- q5_1 (32, 24): fp16 d, fp16 m, qh, nibbles; w = q·d + m.
- q4_k (256, 144): fp16 d, fp16 dmin, 12 bytes packing eight 6-bit scales and eight 6-bit mins, 128 bytes where
  sub-blocks 2i and 2i+1 (32 weights each) are the low and high nibbles of bytes 32i..32i+31; w = d·sc·q − dmin·m.
- q5_k (256, 176): fp16 d, fp16 dmin, 12 bytes of scales/mins, 32 bytes qh (bit s of byte j is the 5th bit of
  weight 32s+j), 128 bytes of nibbles as q4_k.
- q6_k (256, 210): 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales (one per 16 weights),
  fp16 d; w = d·scale·(q−32).
- f32, f16, bf16 (1 weight, 4 / 2 / 2 bytes): the value itself.

`dequantize` applies the same float32 operations in the same order as gguf-py's `gguf.quants` (which transformers'
GGUF loader calls), so its result equals theirs bit for bit; tests/test_gguf_blocks.py checks every format.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_trt.errors import CheckpointError

QK_K = 256  # weights per super-block of the k-quants

# format -> (weights per block, bytes per block), ggml's block sizes.
BLOCKS: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24),
    "q4_k": (QK_K, 144), "q5_k": (QK_K, 176), "q6_k": (QK_K, 210),
}
FORMATS = tuple(BLOCKS)
BLOCK_WEIGHTS = {f: n for f, (n, _) in BLOCKS.items()}
BLOCK_BYTES = {f: b for f, (_, b) in BLOCKS.items()}
# Bytes that 256 consecutive weights of a row take: what one token's matrix-vector product reads per 256 weights.
BYTES_PER_256 = {f: b * (QK_K // n) for f, (n, b) in BLOCKS.items()}


@dataclass(frozen=True)
class QuantTensor:
    """One weight as rows of blocks. `shape` is the HF shape ((out_features, in_features) for a 2-D weight);
    `data` is uint8 [rows, bytes_per_row]: [out_features, in_features / block_weights · block_bytes] for
    2-D, [1, bytes] for 1-D. Each row is quantized independently, so any permutation of rows is lossless."""

    format: str
    shape: tuple[int, ...]
    data: torch.Tensor

    def __post_init__(self):
        if self.format not in BLOCKS:
            raise CheckpointError(f"unknown weight format {self.format!r}; known: {', '.join(FORMATS)}")
        if not 1 <= len(self.shape) <= 2:
            raise CheckpointError(f"a {len(self.shape)}-D weight of shape {self.shape} cannot be held as rows of "
                                  "blocks (only 1-D and 2-D weights)")
        rows, row_bytes = row_layout(self.format, self.shape)
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (rows, row_bytes):
            raise CheckpointError(f"{self.format} weight of shape {self.shape} needs uint8 data [{rows}, {row_bytes}]"
                                  f", got {self.data.dtype} {list(self.data.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def row_layout(fmt: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, bytes per row) of a weight of `shape` in `fmt`; a row's length must be a whole number of blocks."""
    n, b = BLOCKS[fmt]
    rows, row = (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])
    if row % n:
        raise CheckpointError(f"a row of {row} weights is not a whole number of {fmt} blocks of {n}")
    return rows, row // n * b


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte `at` of each block, as float32 [n_blocks, 1]."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """[n, g·group] bytes -> [n, 2·g·group] ints: each run of `group` bytes gives its low nibbles, then its high."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group).to(torch.int32)
    return (torch.cat([q & 0xF, q >> 4], dim=2)).reshape(n, -1)


def _high_bits(qh: torch.Tensor, n_bits: int) -> torch.Tensor:
    """[n, 4] bytes of a little-endian uint32 -> [n, 32] ints, bit j of the word at column j (q5_0 / q5_1)."""
    bits = qh.to(torch.int32).unsqueeze(2) >> torch.arange(8, dtype=torch.int32)  # [n, 4 bytes, 8 bits]
    return (bits & 1).reshape(qh.shape[0], n_bits)


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes of a q4_k/q5_k block -> its eight 6-bit scales and eight 6-bit mins, float32 [n, 8] each.
    Bytes 0-3: scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for the mins;
    bytes 8-11: the low 4 bits of scales 4-7 (low nibble) and of mins 4-7 (high nibble)."""
    s = scales.to(torch.int32)
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0xF) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def _q8_0(b):
    return b[:, 2:34].view(torch.int8).float() * _f16(b, 0)


def _q4_0(b):
    return _f16(b, 0) * (_nibbles(b[:, 2:18], 16) - 8).float()


def _q4_1(b):
    return _f16(b, 0) * _nibbles(b[:, 4:20], 16).float() + _f16(b, 2)


def _q5_0(b):
    q = _nibbles(b[:, 6:22], 16) | (_high_bits(b[:, 2:6], 32) << 4)
    return _f16(b, 0) * (q - 16).float()


def _q5_1(b):
    q = _nibbles(b[:, 8:24], 16) | (_high_bits(b[:, 4:8], 32) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q4_k(b):
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_f16(b, 0) * sc).reshape(n, 8, 1)
    dm = (_f16(b, 2) * mn).reshape(n, 8, 1)
    q = _nibbles(b[:, 16:144], 32).reshape(n, 8, 32).float()
    return (d * q - dm).reshape(n, QK_K)


def _q5_k(b):
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_f16(b, 0) * sc).reshape(n, 8, 1)
    dm = (_f16(b, 2) * mn).reshape(n, 8, 1)
    ql = _nibbles(b[:, 48:176], 32).reshape(n, 8, 32)
    qh = (b[:, 16:48].to(torch.int32).unsqueeze(1) >> torch.arange(8, dtype=torch.int32).reshape(1, 8, 1)) & 1
    q = (ql | (qh << 4)).float()
    return (d * q - dm).reshape(n, QK_K)


def _q6_k(b):
    n = b.shape[0]
    scales = b[:, 192:208].view(torch.int8).float()
    d = (_f16(b, 208) * scales).reshape(n, 16, 1)
    # ql: two halves of 64 bytes, each giving 4 runs of 32 weights (low nibbles of bytes 0-31, 32-63, then high);
    # qh: two halves of 32 bytes, bits 2s..2s+1 of byte j the top bits of weight 32s+j of that half.
    ql = b[:, 0:128].to(torch.int32).reshape(n, 2, 1, 64)
    ql = torch.cat([ql & 0xF, ql >> 4], dim=2).reshape(n, 8, 32)
    qh = b[:, 128:192].to(torch.int32).reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6]).reshape(1, 1, 4, 1)
    qh = (qh & 3).reshape(n, 8, 32)
    q = ((ql | (qh << 4)) - 32).reshape(n, 16, 16).float()
    return (d * q).reshape(n, QK_K)


def _bf16(b):
    return (b.view(torch.int16).to(torch.int32) << 16).view(torch.float32)


_DEQUANT = {
    "q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1,
    "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k,
    "f32": lambda b: b.view(torch.float32).clone(), "f16": lambda b: b.view(torch.float16).float(), "bf16": _bf16,
}


def dequantize(qt: QuantTensor) -> torch.Tensor:
    """The weights of `qt` as float32 in its HF shape, equal bit for bit to gguf-py's `gguf.quants.dequantize`."""
    blocks = qt.data.contiguous().reshape(-1, BLOCKS[qt.format][1])
    return _DEQUANT[qt.format](blocks).reshape(qt.shape)


# Byte offsets of the fp16 scale fields in a block of each quantized format (d, and m / dmin where it has one). Every
# other byte is a bounded integer, so a block de-quantizes to finite weights exactly when these fields are finite.
SCALE_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_1": (0, 2), "q5_1": (0, 2), "q4_k": (0, 2),
                "q5_k": (0, 2), "q6_k": (208,)}
_FLOAT_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_F16_EXPONENT = 0x7C00  # all five exponent bits set: inf or NaN
_CHUNK = 1 << 24  # float weights checked this many at a time (bounds the temporary mask)


def first_nonfinite(fmt: str, data: torch.Tensor) -> int | None:
    """The index of the first block of `data` (uint8, `fmt`'s blocks back to back; a block is one weight for the float
    formats) that de-quantizes to inf or NaN, or None. Reads the scale fields as strided int16 views: no copy, no loop
    over blocks."""
    b = BLOCKS[fmt][1]
    flat = data.contiguous().reshape(-1)
    if fmt in _FLOAT_DTYPES:
        values = flat.view(_FLOAT_DTYPES[fmt])
        for start in range(0, values.numel(), _CHUNK):
            ok = torch.isfinite(values[start:start + _CHUNK])
            if not bool(ok.all()):
                return start + int((~ok).nonzero()[0, 0])
        return None
    blocks = flat.reshape(-1, b)
    bad = None
    for at in SCALE_FIELDS[fmt]:
        field = blocks[:, at:at + 2].view(torch.int16).reshape(-1)
        mask = (field & _F16_EXPONENT) == _F16_EXPONENT
        if bool(mask.any()):
            first = int(mask.nonzero()[0, 0])
            bad = first if bad is None else min(bad, first)
    return bad


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element of a float tensor is finite."""
    # A finite sum means finite elements (one pass, no temporary); an infinite sum may be overflow alone, so then the
    # elements decide.
    return bool(torch.isfinite(t.sum(dtype=torch.float32))) or bool(torch.isfinite(t).all())


def check_finite(t: torch.Tensor, fmt: str | None, name: str, source) -> None:
    """A CheckpointError naming `name` in `source` when a float tensor (fmt None) or uint8 rows of `fmt` blocks
    de-quantize to inf or NaN; integer tensors (d2t) pass."""
    if fmt is not None:
        bad = first_nonfinite(fmt, t)
        if bad is not None:
            raise CheckpointError(f"{source}: tensor {name} ({fmt}) has a non-finite block scale (inf or NaN) at "
                                  f"block {bad}; the weights are corrupt: convert the model again")
        return
    if t.is_floating_point() and not all_finite(t):
        raise CheckpointError(f"{source}: tensor {name} holds inf or NaN values; the weights are corrupt: convert the "
                              "model again")
