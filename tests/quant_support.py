"""Shared by the quantized-block tests: gguf-py's names for our formats, bit-exact comparison, random blocks."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from eagle_trt.quant_blocks import BLOCKS, FORMATS, QuantTensor

REPO = Path(__file__).resolve().parents[1]
GGML = {f: getattr(gguf.GGMLQuantizationType, f.upper()) for f in FORMATS}
# Byte offsets of each format's fp16 fields in a block (random bytes there could be NaN or inf).
F16_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_1": (0, 2), "q5_1": (0, 2), "q4_k": (0, 2),
              "q5_k": (0, 2), "q6_k": (208,)}
TESTED_BY_GGUF_QUANTIZE = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "bf16", "f16")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str):
    assert got.dtype == want.dtype == torch.float32, what
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (_bits(got) != _bits(want)).sum().item()
    assert diff == 0, f"{what}: {diff} of {got.numel()} weights differ"


def random_blocks(fmt: str, rows: int, row_weights: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [rows, bytes] of `fmt`: every quant bit random, the scales finite fp16 (and float formats finite)."""
    n, b = BLOCKS[fmt]
    if n == 1:  # a float format: finite values
        w = torch.randn(rows, row_weights, generator=gen)
        return {"f32": w, "f16": w.half(), "bf16": w.bfloat16()}[fmt].contiguous().view(torch.uint8)
    blocks = torch.randint(0, 256, (rows * row_weights // n, b), dtype=torch.uint8, generator=gen)
    for at in F16_FIELDS[fmt]:
        blocks[:, at:at + 2] = (torch.randn(blocks.shape[0], 1, generator=gen) * 0.02).half().view(torch.uint8)
    return blocks.reshape(rows, -1)


def gguf_dequantize(qt: QuantTensor) -> torch.Tensor:
    out = gguf.quants.dequantize(qt.data.numpy(), GGML[qt.format])
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(qt.shape)


