"""Quantized blocks: ggml's byte layouts de-quantized as gguf-py does (bit for bit), and float weights quantized as
llama.cpp's reference quantizers do (byte for byte: gguf-py for the 32-weight formats, a golden file from the C
code for Q4_K), each with a mutation the comparison catches.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from eagle_trt.errors import CheckpointError, ConfigError
from eagle_trt.quant_blocks import BLOCKS, BYTES_PER_256, FORMATS, QuantTensor, dequantize
from eagle_trt.quant_encode import quantize_rows

from quant_support import (
    GGML, REPO, TESTED_BY_GGUF_QUANTIZE, assert_same_bits, gguf_dequantize, random_blocks,
)

# --- formats and de-quantization ---------------------------------------------------------------------------------

def test_format_constants_are_ggml_block_sizes():
    for fmt in FORMATS:
        assert BLOCKS[fmt] == gguf.GGML_QUANT_SIZES[GGML[fmt]], fmt
    assert BYTES_PER_256["q4_k"] == 144 and BYTES_PER_256["q6_k"] == 210 and BYTES_PER_256["q8_0"] == 272
    assert BYTES_PER_256["q4_0"] == 144 and BYTES_PER_256["bf16"] == 512


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_equals_gguf_py(fmt):
    gen = torch.Generator().manual_seed(len(fmt) * 31 + BLOCKS[fmt][1])
    qt = QuantTensor(fmt, (6, 512), random_blocks(fmt, 6, 512, gen))
    assert_same_bits(dequantize(qt), gguf_dequantize(qt), fmt)
    bias = QuantTensor(fmt, (512,), random_blocks(fmt, 1, 512, gen))  # a 1-D tensor: one row
    assert_same_bits(dequantize(bias), gguf_dequantize(bias), f"1-D {fmt}")


def test_dequantize_reads_each_field_where_ggml_puts_it():
    """Hand-made blocks, values worked out from ggml-common.h's layout (not from a reference implementation)."""
    one, half = torch.tensor([1.0]).half().view(torch.uint8), torch.tensor([0.5]).half().view(torch.uint8)
    q8 = torch.cat([half, torch.arange(-16, 16, dtype=torch.int8).view(torch.uint8)])
    assert dequantize(QuantTensor("q8_0", (32,), q8[None])).tolist() == [0.5 * v for v in range(-16, 16)]
    # q4_0: byte j = weight j (low nibble) | weight j+16 (high nibble); w = (q - 8) * d
    nib = torch.tensor([(j % 16) | ((15 - j % 16) << 4) for j in range(16)], dtype=torch.uint8)
    w = dequantize(QuantTensor("q4_0", (32,), torch.cat([one, nib])[None]))
    assert w.tolist() == [j - 8.0 for j in range(16)] + [7.0 - j for j in range(16)]
    # q6_k: weight 0 = ql[0] low nibble | (qh[0] bits 0-1) << 4, minus 32, times d * scale[0]
    b = torch.zeros(210, dtype=torch.uint8)
    b[0], b[128], b[192], b[208:210] = 0x05, 0x02, 3, half
    w = dequantize(QuantTensor("q6_k", (256,), b[None]))
    assert w[0].item() == 0.5 * 3 * ((5 | (2 << 4)) - 32) and w[1].item() == 0.5 * 3 * -32


def test_quant_tensor_checks_its_layout():
    with pytest.raises(CheckpointError, match=r"q4_k weight of shape \(4, 256\) needs uint8 data \[4, 144\]"):
        QuantTensor("q4_k", (4, 256), torch.zeros(4, 145, dtype=torch.uint8))
    with pytest.raises(CheckpointError, match="not a whole number of q8_0 blocks"):
        QuantTensor("q8_0", (4, 48), torch.zeros(4, 51, dtype=torch.uint8))
    with pytest.raises(CheckpointError, match="unknown weight format 'q3_k'"):
        QuantTensor("q3_k", (4, 256), torch.zeros(4, 110, dtype=torch.uint8))


# --- quantization ------------------------------------------------------------------------------------------------

def _weights_with_edges(gen: torch.Generator) -> torch.Tensor:
    """Random rows, plus blocks that pin the rounding: a zero block, ties at .5 steps, +max next to -max."""
    w = torch.randn(8, 256, generator=gen) * 0.05
    w[0, :32] = 0
    w[1, :32] = torch.arange(32) - 15.5  # halves: round-half-away differs from half-even here
    w[1, 0] = 127.0  # q8_0: d = 1, so the halves above are exact ties
    w[2, 32:64] = torch.linspace(-1, 1, 32)
    w[2, 40] = -1.0  # two values of equal magnitude and opposite sign: the first one's sign sets d
    return w


@pytest.mark.parametrize("fmt", TESTED_BY_GGUF_QUANTIZE)
def test_quantize_equals_gguf_py(fmt):
    w = _weights_with_edges(torch.Generator().manual_seed(7))
    qt = quantize_rows(w, fmt)
    want = gguf.quants.quantize(w.numpy(), GGML[fmt])
    assert qt.shape == (8, 256) and qt.format == fmt
    assert torch.equal(qt.data, torch.from_numpy(np.ascontiguousarray(want).view(np.uint8)).reshape(8, -1)), fmt


@pytest.mark.parametrize("fmt,bound", [("q8_0", 0.5 / 127), ("q4_0", 1 / 8), ("q4_1", 0.5 / 15), ("q5_0", 1 / 16),
                                       ("q5_1", 0.5 / 31)])
def test_quantize_round_trip_within_a_step(fmt, bound):
    """|w - dequantize(quantize(w))| stays within half a step (one step where the grid is not centred, q4_0 and
    q5_0: -8..7 times d = max/-8), relative to each block's range, plus fp16 rounding of the scale."""
    w = torch.randn(16, 512, generator=torch.Generator().manual_seed(3))
    err = (dequantize(quantize_rows(w, fmt)) - w).abs().reshape(-1, 32)
    blocks = w.reshape(-1, 32)
    scale = blocks.abs().amax(dim=1) if fmt in ("q8_0", "q4_0", "q5_0") else blocks.amax(1) - blocks.amin(1)
    assert (err.amax(dim=1) <= scale * (bound + 2 ** -10)).all(), fmt
    assert err.amax() > 0  # really quantized


def test_rounding_mutation_is_caught(monkeypatch):
    """Half-to-even rounding (torch.round) in place of C's roundf gives other q8_0 bytes than llama.cpp's."""
    from eagle_trt import quant_encode

    w = _weights_with_edges(torch.Generator().manual_seed(7))
    want = torch.from_numpy(gguf.quants.quantize(w.numpy(), GGML["q8_0"]).view(np.uint8)).reshape(8, -1)
    monkeypatch.setattr(quant_encode, "_round_away", torch.round)
    assert not torch.equal(quantize_rows(w, "q8_0").data, want)


def k_reference_input() -> torch.Tensor:
    """[24, 512] float32 from numpy's legacy generator (its stream is fixed forever): weights at four scales, rows
    shifted positive (positive mins), sparse rows, a zero row and a constant row."""
    rs = np.random.RandomState(0)
    x = rs.standard_normal((24, 512)) * np.repeat([1e-4, 0.02, 1.0, 300.0], 6)[:, None]
    x[1::6] += 0.5 * np.abs(x[1::6]).max(axis=1, keepdims=True)
    x[2::6] *= rs.rand(4, 512) < 0.1
    x[3], x[4] = 0.0, 0.3
    return torch.from_numpy(x.astype(np.float32))


def k_reference(fmt: str) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(REPO / "tests" / "fixtures" / f"{fmt}_reference.bin", dtype=np.uint8))


K_QUANTS = ("q4_k", "q6_k")


@pytest.mark.parametrize("fmt", K_QUANTS)
def test_k_quant_equals_llama_cpp_reference(fmt):
    """tests/fixtures/{q4_k,q6_k}_reference.bin: what llama.cpp's quantize_row_q4_K_ref / quantize_row_q6_K_ref
    (ggml-quants.c of llama-cpp-python 0.3.36's vendored llama.cpp, gcc -O3 with x86-64's default flags, as
    ggml-base is built) wrote for k_reference_input()."""
    qt = quantize_rows(k_reference_input(), fmt)
    assert qt.data.shape == (24, 2 * BLOCKS[fmt][1])
    assert torch.equal(qt.data.reshape(-1), k_reference(fmt))


@pytest.mark.parametrize("fmt,mutation", [("q4_k", ("_seq_sum", lambda t: t.sum(dim=0))), ("q4_k", ("_NSTEP", -1)),
                                          ("q6_k", ("_QX_STEPS", ()))])
def test_k_quant_mutations_are_caught(monkeypatch, fmt, mutation):
    """q4_k's sums in torch's own order (pairwise, vectorised) in place of C's left-to-right loop, or either
    format's search over candidate grids left out: other bytes than llama.cpp's. (q6_k's bytes do not move with
    the sum order on this input: its choice between grids is a comparison with margin.)"""
    from eagle_trt import quant_k

    monkeypatch.setattr(quant_k, *mutation)
    assert not torch.equal(quantize_rows(k_reference_input(), fmt).data.reshape(-1), k_reference(fmt))


def _ggml_base():
    """ctypes handle on the libggml-base of an installed llama-cpp-python (the optional llama.cpp extra)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import ctypes

    libs = sorted(Path(llama_cpp.__file__).parent.glob("lib/libggml-base.*"))
    if not libs:
        pytest.skip("llama_cpp has no lib/libggml-base")
    return ctypes.CDLL(str(libs[0]))


def _ggml_fn(lib, fmt: str, what: str):
    import ctypes

    suffix = fmt[:2] + "_" + (fmt[3:].upper() if fmt.endswith("k") else fmt[3:])  # q8_0 -> q8_0, q4_k -> q4_K
    fn = getattr(lib, f"{what}_row_{suffix}" + ("_ref" if what == "quantize" else ""))
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return fn


@pytest.mark.parametrize("fmt", ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k"))
def test_equals_installed_llama_cpp(fmt):
    """Against llama.cpp's own C code, where llama-cpp-python is installed: quantize_row_*_ref's bytes and
    dequantize_row_*'s floats, on weights of many scales with a zero block and exact ties."""
    lib = _ggml_base()
    rs = np.random.RandomState(5)
    x = (rs.standard_normal((256, 512)) * np.exp(rs.standard_normal((256, 1))) * 0.05).astype(np.float32)
    x[0, :32], x[1, :32] = 0, np.arange(32) - 15.5
    x[1, 0] = 127
    n, b = BLOCKS[fmt]
    want = np.zeros(x.size // n * b, dtype=np.uint8)
    _ggml_fn(lib, fmt, "quantize")(x.ctypes.data, want.ctypes.data, x.size)
    qt = quantize_rows(torch.from_numpy(x), fmt)
    assert torch.equal(qt.data.reshape(-1), torch.from_numpy(want))
    floats = np.zeros(x.size, dtype=np.float32)
    _ggml_fn(lib, fmt, "dequantize")(want.ctypes.data, floats.ctypes.data, x.size)
    assert_same_bits(dequantize(qt).reshape(-1), torch.from_numpy(floats), fmt)


def test_q5_k_dequantize_equals_installed_llama_cpp():
    lib = _ggml_base()
    qt = QuantTensor("q5_k", (8, 512), random_blocks("q5_k", 8, 512, torch.Generator().manual_seed(9)))
    floats = np.zeros(8 * 512, dtype=np.float32)
    _ggml_fn(lib, "q5_k", "dequantize")(qt.data.numpy().ctypes.data, floats.ctypes.data, floats.size)
    assert_same_bits(dequantize(qt).reshape(-1), torch.from_numpy(floats), "q5_k")


def test_k_quant_round_trip_within_a_step():
    """Each group comes back within one step of its grid (its scale, and q4_k's min, are themselves rounded to 6 or
    8 bits, so half a step is not a bound): q4_k's 32 weights on 16 levels over their range, q6_k's 16 weights on
    64 levels over ±max."""
    w = torch.randn(16, 1024, generator=torch.Generator().manual_seed(4)) * 0.02
    err = (dequantize(quantize_rows(w, "q4_k")) - w).abs().reshape(-1, 32)
    sub = w.reshape(-1, 32)
    span = sub.amax(dim=1) - sub.amin(dim=1).clamp(max=0)
    assert (err.amax(dim=1) <= span / 15).all() and err.amax() > 0
    err = (dequantize(quantize_rows(w, "q6_k")) - w).abs().reshape(-1, 16)
    assert (err.amax(dim=1) <= w.reshape(-1, 16).abs().amax(dim=1) / 32).all() and err.amax() > 0


def test_quantize_refuses_what_it_cannot_make():
    with pytest.raises(ConfigError, match="cannot quantize weights to 'q5_k'.*q5_k comes from a GGUF"):
        quantize_rows(torch.zeros(4, 256), "q5_k")
    with pytest.raises(CheckpointError, match="not a whole number of q4_0 blocks"):
        quantize_rows(torch.zeros(4, 40), "q4_0")


