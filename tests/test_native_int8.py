"""The block projections with int8 activations (csrc/gemm_int8.cpp, int8_blocks.h): per format (q8_0, q4_0, q4_k,
q6_k) and per build (this machine's, AVX2, and AVX-VNNI where the CPU has it) the activation quantizer equals the
torch reference bit for bit, a T-row call equals T one-row calls bit for bit, the thread count changes nothing, the
builds agree bit for bit, the result equals the torch reference (`Int8Reference`: the integers exactly, the fp32
steps up to its float64 fma), and it stays within the activation quantization's error bound of the fp32 product over
gguf-py's de-quantized weight. Where the CPU has AMX-INT8, many-row calls go through the tiles
(csrc/gemm_int8_amx.cpp): every call of every row count gives the vector path's bits."""

import contextlib
import functools

import pytest
import torch

from eagle_trt.models import block_weights as bw
from eagle_trt.models import isa
from eagle_trt.models.int8_reference import Int8Reference, quantize
from eagle_trt.models.native import bindings, build, int8_gemm
from eagle_trt.models.native.block_gemm import BlockProjection, pack
from native_support import builds
from test_native_blocks import random_blocks

FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k"]


@functools.cache
def int8_builds() -> dict:
    """builds() plus an AVX-VNNI build (-march=x86-64-v3 -mavxvnni) where this CPU has AVX-VNNI."""
    out = dict(builds())
    if out and "avx_vnni" in isa.cpu_flags():
        out["avxvnni"] = bindings.Library(build.build(target_isa="avxvnni"))
    return out


def names() -> list[str]:
    return list(int8_builds()) or ["none"]


def lib_of(name: str):
    if name not in int8_builds():
        pytest.skip("no native kernels here")
    return int8_builds()[name]


def test_each_build_uses_its_integer_dot():
    libs = int8_builds()
    if not libs:
        pytest.skip("no native kernels here")
    dots = {name: lib.int8_dot() for name, lib in libs.items()}
    assert dots.get("avx2", 1) == 1 and dots.get("avxvnni", 2) == 2
    if "avx512_vnni" in isa.cpu_flags() and "avx512" in dots:
        assert dots["avx512"] == 3


@pytest.mark.parametrize("name", names())
def test_the_activation_quantizer_is_the_reference_bit_for_bit(name):
    lib = lib_of(name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 512, generator=g) * torch.logspace(-3, 3, 6).unsqueeze(1)
    x = torch.cat([x, x.bfloat16().float()])  # bf16 values: products that land on .5 exactly, ties to even
    x[2, :256] = 0.0  # all-zero blocks: scale 0, codes 0
    x[3, 7] = 1e4  # one block dominated by an outlier
    for block in (32, 256):
        a, d = int8_gemm.quantize(lib, x, block)
        ra, rd = quantize(x, block)
        assert torch.equal(a.to(torch.int32), ra) and torch.equal(d, rd)
        assert a.abs().max().item() == 127


def _alone(proj, x):
    return torch.cat([proj(x[i:i + 1]) for i in range(x.shape[0])])


@pytest.mark.parametrize("name", names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_independent_and_equal_the_reference(name, dtype, fmt):
    lib = lib_of(name)
    w = random_blocks(fmt, 70, 512, seed=1)
    proj = BlockProjection(lib, w, "int8")
    assert proj.compute == "int8"
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(2)).to(dtype)
    alone = _alone(proj, x)
    for t in (2, 3, 5, 16, 17):  # register blocks of rows of every size and remainder
        assert torch.equal(proj(x[:t]), alone[:t]), t
    for threads in (1, 3):  # the thread count splits output rows, never a sum
        torch.set_num_threads(threads)
        try:
            assert torch.equal(proj(x), alone)
        finally:
            torch.set_num_threads(2)
    ref = Int8Reference(w)(x)
    assert (alone.float() - ref.float()).abs().max().item() <= 1e-6 * ref.float().abs().max().item()
    assert torch.equal(Int8Reference(w)(x[:5]), torch.cat([Int8Reference(w)(x[i:i + 1]) for i in range(5)]))


# The fp16 fields of a GGUF block of each format (byte offset in the block), the rest codes and sub-block scales.
_FP16_AT = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}


def _filled_blocks(fmt: str, fill: int, out: int, k: int) -> bw.BlockWeight:
    """Every code and sub-block scale byte `fill` (0xFF: each format's largest code and scale), the fp16 fields 0.01."""
    elems = bw.block_elems(fmt)
    blocks = torch.full((out, k // elems, bw.row_bytes(fmt, elems)), fill, dtype=torch.uint8)
    half = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)
    for at in _FP16_AT[fmt]:
        blocks[:, :, at:at + 2] = half
    return bw.from_rows(fmt, blocks.reshape(out, -1), k)


@pytest.mark.parametrize("name", names())
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_integer_sums_at_their_bounds(name, fmt):
    """The largest codes and scales against activations at +-127 (rows of one sign, alternating signs, and a random
    row): where a build adds several 8-bit dot products in 16 bits (int8_sums_avx2.h), its bounds must hold at the
    extremes, where an over-long int16 sum would wrap."""
    lib = lib_of(name)
    k = 512
    x = torch.stack([torch.ones(k), -torch.ones(k), torch.ones(k) * (-1) ** torch.arange(k),
                     torch.randn(k, generator=torch.Generator().manual_seed(11))])
    for fill in (0xFF, 0x80, 0x7F):
        w = _filled_blocks(fmt, fill, 20, k)
        ref = Int8Reference(w)(x)
        y = BlockProjection(lib, w, "int8")(x)
        assert (y - ref).abs().max().item() <= 1e-6 * ref.abs().max().item(), (fmt, hex(fill))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_builds_agree_bit_for_bit(fmt):
    libs = int8_builds()
    if len(libs) < 2:
        pytest.skip("one kernel build here")
    w = random_blocks(fmt, 33, 768, seed=3)
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (5, 17):  # 17: the tiles' rows where a build has them
            x = torch.randn(rows, 768, generator=torch.Generator().manual_seed(4)).to(dtype)
            outs = {name: BlockProjection(lib, w, "int8")(x) for name, lib in libs.items()}
            first = next(iter(outs.values()))
            assert all(torch.equal(first, o) for o in outs.values()), (list(outs), rows)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_prefetch_distance_changes_no_bit(fmt):
    libs = int8_builds()
    if not libs:
        pytest.skip("no native kernels here")
    w = random_blocks(fmt, 40, 768, seed=5)
    x = torch.randn(5, 768, generator=torch.Generator().manual_seed(6))
    for name, lib in libs.items():
        proj = BlockProjection(lib, w, "int8")
        before = lib.int8_set_prefetch(-1)
        try:
            outs = []
            for distance in (0, 64, 4096, 1 << 20):  # 1 MiB: past the buffer's end, which a prefetch may name
                assert lib.int8_set_prefetch(distance) >= 0
                assert lib.int8_set_prefetch(-1) == distance
                outs.append(torch.cat([proj(x[:1]), proj(x)]))
            assert all(torch.equal(outs[0], o) for o in outs), name
        finally:
            lib.int8_set_prefetch(before)
        assert lib.int8_set_prefetch(-1) == before


def test_the_prefetch_setting_from_the_environment(monkeypatch):
    from eagle_trt.errors import InputError
    from eagle_trt.models import native

    monkeypatch.delenv("EAGLE_TRT_INT8_PREFETCH", raising=False)
    assert native.prefetch_requested() is None
    monkeypatch.setenv("EAGLE_TRT_INT8_PREFETCH", "8192")
    assert native.prefetch_requested() == 8192
    monkeypatch.setenv("EAGLE_TRT_INT8_PREFETCH", "0")
    assert native.prefetch_requested() == 0
    for bad in ("4k", "-1", str((1 << 20) + 1)):
        monkeypatch.setenv("EAGLE_TRT_INT8_PREFETCH", bad)
        with pytest.raises(InputError, match="EAGLE_TRT_INT8_PREFETCH"):
            native.prefetch_requested()


@contextlib.contextmanager
def tiles_from(lib, rows: int):
    """Calls of `rows` rows or more take the AMX-INT8 tiles (where the library has them) inside the block."""
    before = lib.int8_set_amx_rows(rows)
    try:
        yield
    finally:
        lib.int8_set_amx_rows(before)


def tile_lib():
    """A build whose many-row calls can take AMX-INT8 tiles here, or a skip saying why there is none."""
    for lib in int8_builds().values():
        if lib.int8_amx():
            return lib
    pytest.skip("no AMX-INT8 here (the CPU lacks amx_int8, or the kernels were built without it): the vector path "
                "takes every call")


NEVER = 1 << 40


def test_the_tile_path_switch():
    """From 8 rows by default; the setter answers the threshold it replaces and leaves it alone for rows <= 0."""
    libs = int8_builds()
    if not libs:
        pytest.skip("no native kernels here")
    lib = next(iter(libs.values()))
    assert lib.int8_set_amx_rows(0) == 8
    with tiles_from(lib, 3):
        assert lib.int8_set_amx_rows(0) == 3
    assert lib.int8_set_amx_rows(0) == 8
    for name, other in libs.items():
        assert other.int8_amx() in (0, 1)
        if name in ("avx2", "avxvnni"):
            assert other.int8_amx() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_tile_path_gives_the_vector_paths_bits(fmt, dtype):
    """Every row count, with the tiles taking every call and with the vector path taking every call: the same bits
    (one 16-row tile and a remainder of 1, 6 or 9 rows on its own tiles, several of each, 2- and 3-block rests of q8_0/q4_0/q5_0's pairs of blocks,
    a last group of fewer than 16 outputs), and the thread count changes nothing."""
    lib = tile_lib()
    for n, k in ((70, 768), (33, 512), (16, 1280)):
        if fmt in ("q4_k", "q6_k") and k % 256:
            continue
        proj = BlockProjection(lib, random_blocks(fmt, n, k, seed=n), "int8")
        x = torch.randn(41, k, generator=torch.Generator().manual_seed(k)).to(dtype)
        with tiles_from(lib, NEVER):
            vector = {m: proj(x[:m]) for m in (1, 2, 7, 8, 9, 16, 17, 22, 32, 33, 41)}
        with tiles_from(lib, 1):
            for m, want in vector.items():
                assert torch.equal(proj(x[:m]), want), (n, k, m)
            for threads in (1, 3):
                torch.set_num_threads(threads)
                try:
                    assert torch.equal(proj(x), vector[41])
                finally:
                    torch.set_num_threads(2)


def test_the_tile_path_takes_mixed_segments():
    lib = tile_lib()
    parts = [random_blocks("q4_k", 16, 512, 5), random_blocks("q6_k", 24, 512, 7), random_blocks("q4_k", 9, 512, 6)]
    fused = bw.projection_weight(parts)
    x = torch.randn(19, 512, generator=torch.Generator().manual_seed(8)).bfloat16()
    with tiles_from(lib, NEVER):
        want = BlockProjection(lib, fused, "int8")(x)
    with tiles_from(lib, 1):
        assert torch.equal(BlockProjection(lib, fused, "int8")(x), want)
        assert torch.equal(want, torch.cat([BlockProjection(lib, p, "int8")(x) for p in parts], dim=1))


@pytest.mark.parametrize("fmt", FORMATS)
def test_within_the_quantization_bound_of_the_fp32_product(fmt):
    """|y - x @ W^T| <= sum over activation blocks b of (amax_b / 254) * sum_{k in b} |w_k| (each activation is off
    by at most half its block's step amax_b / 127), plus fp32 summation slack."""
    lib = lib_of(names()[0])
    w = random_blocks(fmt, 64, 1024, seed=5)
    x = torch.randn(4, 1024, generator=torch.Generator().manual_seed(6))
    y = BlockProjection(lib, w, "int8")(x).double()
    wf = bw.dequantize(w).double()
    exact = x.double() @ wf.t()
    block = 256 if fmt in ("q4_k", "q6_k") else 32  # the activation blocks
    amax = x.double().abs().reshape(4, -1, block).amax(-1)  # [M, blocks]
    wsum = wf.abs().reshape(64, -1, block).sum(-1)  # [N, blocks]
    bound = 1.001 * (amax / 254) @ wsum.t() + 1e-5 * (x.double().abs() @ wf.abs().t())
    assert ((y - exact).abs() <= bound).all()
    rel = ((y - exact).norm() / exact.norm()).item()
    assert rel < 0.02, rel


@pytest.mark.parametrize("name", names())
def test_mixed_segments_and_the_float_fallback(name):
    lib = lib_of(name)
    parts = [random_blocks("q4_k", 16, 256, 5), random_blocks("q6_k", 8, 256, 7), random_blocks("q4_k", 8, 256, 6)]
    fused = bw.projection_weight(parts)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(8))
    y = BlockProjection(lib, fused, "int8")(x)
    assert torch.equal(y, torch.cat([BlockProjection(lib, p, "int8")(x) for p in parts], dim=1))
    # A segment the int8 path lacks (q5_1) keeps the whole weight on the fp32 block path.
    mixed = bw.projection_weight([random_blocks("q4_k", 16, 256, 5), random_blocks("q5_1", 16, 256, 9)])
    proj = BlockProjection(lib, mixed, "int8")
    assert proj.compute == "float" and torch.equal(proj(x), BlockProjection(lib, mixed)(x))
    # The packed buffer says its layout: from_packed (the weight cache's path) keeps int8.
    p = BlockProjection(lib, parts[0], "int8")
    again = BlockProjection.from_packed(lib, p.w, 256, 16)
    assert again.compute == "int8" and torch.equal(again(x), p(x))
    with pytest.raises(ValueError, match="int8 activations take"):
        int8_gemm.pack(lib, mixed)
    assert not torch.equal(p.w, pack(parts[0]))


def test_the_reference_kernels_store_and_restore_int8_blocks():
    """The torch reference with block_compute int8 keeps the GGUF rows in the weight cache and restores the same
    projection (no compiled kernels needed)."""
    from eagle_trt.models.reference import TorchKernels

    kernels = TorchKernels(torch.float32, block_compute="int8")
    w = bw.projection_weight([random_blocks("q4_k", 16, 256, 1), random_blocks("q6_k", 8, 256, 2)])
    proj = kernels.projection(w)
    again = kernels.projection_from_state(*kernels.projection_state(proj))
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    assert isinstance(again, Int8Reference) and torch.equal(again(x), proj(x))
    assert kernels.cache_key == "torch-float32-int8" and TorchKernels(torch.float32).cache_key == "torch-float32"
