"""The block projections (csrc/gemm_blocks.cpp): GGUF blocks de-quantized to gguf-py's values bit for bit, every
output row a function of its input row alone (a many-row call equals one-row calls, fp32 and bf16, every build),
the AVX2 and AVX-512 builds giving the same bits, and the product within fp32 summation error of the torch reference
over gguf-py's de-quantized weight."""

import gguf
import numpy as np
import pytest
import torch

from eagle_trt.models import block_weights as bw
from eagle_trt.models.native.block_gemm import BlockProjection, pack
from native_support import build_names, builds, lib_or_skip

# Byte offsets of each k-quant block's fp16 scales (ggml-common.h): random bytes there could be NaN or inf.
_HALVES = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}
FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "f16", "bf16", "f32"]


def random_blocks(fmt: str, out: int, k: int, seed: int = 0) -> bw.BlockWeight:
    """A [out, k] weight in `fmt`: quantized from random floats where gguf-py quantizes, else random codes with
    finite, moderate fp16 scales."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, k, generator=g)
    if fmt in bw.QUANTIZABLE:
        return bw.quantize(w, fmt)
    if fmt in ("f16", "bf16", "f32"):
        t = w.to(getattr(torch, {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}[fmt]))
        return bw.from_rows(fmt, t.contiguous().view(torch.uint8).reshape(out, -1), k)
    data = torch.randint(0, 256, (out, bw.row_bytes(fmt, k)), dtype=torch.uint8, generator=g)
    block = {"q4_k": 144, "q5_k": 176, "q6_k": 210}[fmt]
    scales = (torch.rand(out, k // 256, generator=g) * 0.01 + 1e-4).to(torch.float16).view(torch.uint8).reshape(
        out, k // 256, 2)
    blocks = data.view(out, k // 256, block)
    for at in _HALVES[fmt]:
        blocks[:, :, at:at + 2] = scales
    return bw.from_rows(fmt, data, k)


@pytest.mark.parametrize("name", build_names())
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_is_gguf_py_bit_for_bit(name, fmt):
    lib = lib_or_skip(name)
    w = random_blocks(fmt, 7, 512)
    qtype = gguf.GGMLQuantizationType(bw.FORMATS[fmt])
    ref = torch.from_numpy(np.asarray(gguf.quants.dequantize(w.segments[0].data.numpy(), qtype), dtype=np.float32))
    assert torch.equal(BlockProjection(lib, w).dequantized(), ref.reshape(7, 512))
    assert torch.equal(bw.dequantize(w), ref.reshape(7, 512))


@pytest.mark.parametrize("name", build_names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "q5_1", "q4_k", "q6_k"])
def test_rows_are_independent_and_match_the_reference(name, dtype, fmt):
    lib = lib_or_skip(name)
    w = random_blocks(fmt, 70, 512, seed=1)
    proj = BlockProjection(lib, w)
    x = torch.randn(19, 512, generator=torch.Generator().manual_seed(2)).to(dtype)
    together = proj(x)
    assert torch.equal(together, torch.cat([proj(x[i:i + 1]) for i in range(19)]))
    for threads in (1, 3):  # the thread count splits output rows, never a sum
        torch.set_num_threads(threads)
        try:
            assert torch.equal(proj(x), together)
        finally:
            torch.set_num_threads(2)
    ref = bw.BlockReference(w)
    expect = x.float() @ ref.w
    tol = 1e-4 * expect.abs().max().item() if dtype is torch.float32 else 1e-2 * expect.abs().max().item()
    assert (together.float() - expect).abs().max().item() <= tol
    assert torch.equal(ref(x), torch.cat([ref(x[i:i + 1]) for i in range(19)]))


def test_the_builds_agree_bit_for_bit():
    if len(builds()) < 2:
        pytest.skip("one kernel build here")
    w = random_blocks("q4_k", 33, 768, seed=3)
    x = torch.randn(5, 768, generator=torch.Generator().manual_seed(4))
    outs = [BlockProjection(lib, w)(x) for lib in builds().values()]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("name", build_names())
def test_a_fused_weight_of_mixed_formats(name):
    lib = lib_or_skip(name)
    parts = [random_blocks("q4_k", 16, 256, 5), random_blocks("q4_k", 8, 256, 6), random_blocks("q6_k", 8, 256, 7)]
    fused = bw.projection_weight(parts)
    assert fused.formats == ["q4_k", "q6_k"] and fused.shape == (32, 256)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(8))
    y = BlockProjection(lib, fused)(x)
    alone = torch.cat([BlockProjection(lib, p)(x) for p in parts], dim=1)
    assert torch.equal(y, alone)


def test_a_buffer_for_another_shape_is_refused():
    w = random_blocks("q8_0", 4, 64)
    lib = next(iter(builds().values()), None)
    if lib is None:
        pytest.skip("no native kernels here")
    buf = pack(w)
    with pytest.raises(ValueError, match="does not fit"):
        BlockProjection.from_packed(lib, buf, 64, 5)
    proj = BlockProjection.from_packed(lib, buf, 64, 4)
    proj.in_features, proj.out_features = 64, 5  # a header that disagrees with the call: the kernel refuses it
    with pytest.raises(RuntimeError, match="code -2"):
        proj(torch.randn(1, 64))


def test_row_bytes_follow_gguf():
    assert bw.row_bytes("q8_0", 64) == 68 and bw.row_bytes("q4_k", 512) == 288 and bw.row_bytes("q6_k", 256) == 210
    with pytest.raises(ValueError, match="multiple of 256"):
        bw.row_bytes("q4_k", 576)
    lib = next(iter(builds().values()), None)
    if lib is not None:
        for fmt in FORMATS:
            assert lib.blocks_row_bytes(bw.FORMATS[fmt], 512) == bw.row_bytes(fmt, 512)
        assert lib.blocks_row_bytes(bw.FORMATS["q4_k"], 576) == -2
    assert np.isfinite(bw.dequantize(random_blocks("q5_k", 2, 256)).numpy()).all()
