"""Projections on the compiled kernels (models/native/gemm.py): matmul's values, and every output row a function of
its input row alone at any row count and thread count, on every build this machine runs (the vector kernel for
fp32 and bf16 weights; AMX tiles where the CPU has them)."""

import pytest
import torch

from eagle_trt.models.native.gemm import NativeProjection
from native_support import build_names, builds, lib_or_skip

amx = builds().get("amx")
needs_amx = pytest.mark.skipif(amx is None, reason="this CPU has no AMX (or EAGLE_TRT_ISA hides it): no AMX kernel")
DTYPES = [torch.float32, torch.bfloat16]


def _w_x(k, n, m, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, generator=g).to(dtype), torch.randn(m, k, generator=g).to(dtype)


def _tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.15, rtol=0.02)


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,n", [(1, 5), (7, 33), (64, 40), (576, 960), (1536, 576), (96, 1000)])
def test_matches_matmul(build, dtype, k, n):
    lib = lib_or_skip(build)
    for m in (1, 2, 3, 4, 6, 7, 13, 16, 17, 65):
        w, x = _w_x(k, n, m, dtype, seed=k + n + m)
        got = NativeProjection(lib, w)(x)
        assert got.shape == (m, n) and got.dtype == dtype
        torch.testing.assert_close(got.float(), x.float() @ w.float(), **_tol(dtype))


def _each_row_alone(proj, x):
    full = proj(x)
    for m in (1, 2, 3, 4, 5, 6, 7, 12, 13, 16, 17, 24, 31, 33, 64, 65, x.shape[0]):
        assert torch.equal(proj(x[:m]), full[:m]), m
    for i in (0, 5, 6, 16, 63, 64, x.shape[0] - 1):
        assert torch.equal(proj(x[i:i + 1]), full[i:i + 1]), i
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert torch.equal(proj(x), full), n
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [3072 + 32 + 8, 576])
def test_each_row_equals_that_row_alone_at_any_thread_count(build, dtype, n):
    """Row blocks, chunks of K and the threads' column ranges change with the call; no output bit does."""
    w, x = _w_x(576, n, 130, dtype)
    _each_row_alone(NativeProjection(lib_or_skip(build), w), x)


@pytest.mark.parametrize("build", build_names())
def test_writes_into_a_given_buffer_and_checks_its_input(build):
    lib = lib_or_skip(build)
    w, x = _w_x(64, 96, 5, torch.float32)
    proj = NativeProjection(lib, w)
    buf = torch.empty(5, 96)
    got = proj(x, buf)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, proj(x))
    with pytest.raises(ValueError, match=r"out must be .* shape \[5, 96\], got torch.float32 \[4, 96\]"):
        proj(x, torch.empty(4, 96))
    with pytest.raises(ValueError, match="input has 32 features; the weight takes 64"):
        proj(x[:, :32])
    with pytest.raises(TypeError, match="takes a 2-D torch.float32 CPU input"):
        proj(x.bfloat16())
    assert proj(x[:0]).shape == (0, 96)
    assert proj.w.numel() == lib.gemm_packed_size(64, 96, 0) and proj.w.dtype == torch.float32


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_is_the_argmax_of_the_product(build, dtype):
    w, x = _w_x(64, 300, 20, dtype, seed=2)
    w[:, 250] = w[:, 7]  # an exact tie: the first column wins
    proj = NativeProjection(lib_or_skip(build), w)
    assert torch.equal(proj.argmax(x), proj(x).argmax(dim=-1))


# ---- AMX tiles (bf16) ------------------------------------------------------------------------------------------
@needs_amx
@pytest.mark.parametrize("k,n", [(32, 16), (576, 960), (1536, 576), (64, 40), (64, 80), (96, 1000)])
def test_amx_matches_matmul(k, n):
    for m in (1, 5, 8, 12, 16, 17, 32, 33, 70):
        w, x = _w_x(k, n, m, seed=k + n + m)
        got = NativeProjection(amx, w, amx=True)(x)
        assert got.shape == (m, n) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), x.float() @ w.float(), atol=0.15, rtol=0.02)


@needs_amx
@pytest.mark.parametrize("n", [3072 + 32 + 8, 3072 + 8])  # a last column group partly filled; groups even, odd
def test_amx_each_row_equals_that_row_alone_at_any_thread_count(n):
    """8 to 16 rows take two column groups at a time, other counts one: every row the same bits either way."""
    w, x = _w_x(576, n, 70)
    _each_row_alone(NativeProjection(amx, w, amx=True), x)


@needs_amx
def test_amx_leaves_onednn_bf16_right_around_it():
    """Tile configuration is per thread and oneDNN uses the tiles too: the kernel restores what it found."""
    from eagle_trt.models.gemm import Projection

    w, x = _w_x(576, 960, 20)
    ours, theirs = NativeProjection(amx, w, amx=True), Projection(w)
    assert theirs.packed is not None
    ref = x.float() @ w.float()
    for _ in range(3):
        torch.testing.assert_close(theirs(x).float(), ref, atol=0.15, rtol=0.02)
        torch.testing.assert_close(ours(x).float(), ref, atol=0.15, rtol=0.02)


@needs_amx
def test_amx_rejects_what_it_does_not_take():
    w, x = _w_x(100, 64, 3)
    with pytest.raises(ValueError, match="multiple of 32"):
        NativeProjection(amx, w, amx=True)
    with pytest.raises(ValueError, match="multiple of 32"):
        NativeProjection(amx, w.float()[:96], amx=True)


@needs_amx
@pytest.mark.parametrize("k,n", [(32, 16), (576, 960), (64, 40), (64, 80), (96, 1000)])
def test_amx_fused_argmax_is_the_argmax_of_the_stored_product(k, n):
    """The greedy step's LM head: the argmax of what the kernel would store, at any row and thread count (8 to 16
    rows take two column groups at a time)."""
    before = torch.get_num_threads()
    try:
        for m in (1, 5, 8, 12, 16, 17, 33):
            w, x = _w_x(k, n, m, seed=k + n + m)
            proj = NativeProjection(amx, w, amx=True)
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                assert torch.equal(proj.argmax(x), proj(x).argmax(dim=-1)), (m, threads)
    finally:
        torch.set_num_threads(before)


@needs_amx
def test_amx_fused_argmax_breaks_ties_and_reads_nan_as_torch_does():
    w, x = _w_x(64, 200, 4, seed=3)
    w[:, 150] = w[:, 7]  # an exact tie across the threads' column ranges: the first column wins
    w[:, 8] = w[:, 7]
    x[1] = 0  # a row of zeros: every logit ties at 0
    proj = NativeProjection(amx, w, amx=True)
    got = proj.argmax(x)
    assert torch.equal(got, proj(x).argmax(dim=-1)) and int(got[1]) == 0
    w[3, 120] = float("nan")  # NaN logits in every row with a nonzero x[:, 3]
    w[3, 180] = float("nan")
    proj = NativeProjection(amx, w, amx=True)
    assert torch.equal(proj.argmax(x), proj(x).argmax(dim=-1))
