"""bf16 projections on AMX tiles (models/native_gemm.py): matmul's values, every output row a function of its
input row alone (any row count, any thread count), and oneDNN's own AMX use unharmed beside it."""

import os
import subprocess
import sys

import pytest
import torch

from eagle_trt.models import native_gemm
from eagle_trt.models.gemm import Projection

amx = native_gemm.load()
needs_amx = pytest.mark.skipif(amx is None, reason="no AMX here (or no C++ compiler): bf16 projections use oneDNN")


def _w_x(k, n, m, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, generator=g).bfloat16(), torch.randn(m, k, generator=g).bfloat16()


@needs_amx
@pytest.mark.parametrize("k,n", [(32, 16), (576, 960), (1536, 576), (64, 40), (64, 80), (96, 1000)])
@pytest.mark.parametrize("m", [1, 5, 8, 12, 16, 17, 32, 33, 70])
def test_matches_matmul(k, n, m):
    w, x = _w_x(k, n, m, seed=k + n + m)
    got = amx(x, amx.pack(w), n)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), x.float() @ w.float(), atol=0.15, rtol=0.02)


@needs_amx
@pytest.mark.parametrize("n", [3072 + 32 + 8, 3072 + 8])  # a last column group partly filled; groups even, odd
def test_each_row_equals_that_row_alone_at_any_thread_count(n):
    """8 to 16 rows take two column groups at a time, other counts one: every row the same bits either way."""
    w, x = _w_x(576, n, 70)
    packed = amx.pack(w)
    full = amx(x, packed, w.shape[1])
    for m in (1, 7, 8, 12, 15, 16, 17, 31, 32, 33, 64, 70):
        part = amx(x[:m], packed, w.shape[1])
        assert torch.equal(part, full[:m]), m
    for i in (0, 15, 16, 31, 32, 69):
        assert torch.equal(amx(x[i:i + 1], packed, w.shape[1]), full[i:i + 1]), i
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(amx(x, packed, w.shape[1]), full)
    finally:
        torch.set_num_threads(threads)


@needs_amx
def test_onednn_bf16_still_right_around_it(monkeypatch):
    """Tile configuration is per thread and oneDNN uses the tiles too: the kernel restores what it found."""
    w, x = _w_x(576, 960, 20)
    ours = Projection(w)
    assert ours.amx is not None
    monkeypatch.setattr(native_gemm, "load", lambda: None)
    theirs = Projection(w)
    assert theirs.amx is None and theirs.packed is not None
    ref = x.float() @ w.float()
    for _ in range(3):
        torch.testing.assert_close(theirs(x).float(), ref, atol=0.15, rtol=0.02)
        torch.testing.assert_close(ours(x).float(), ref, atol=0.15, rtol=0.02)


@needs_amx
def test_rejects_what_it_does_not_take():
    w, x = _w_x(100, 64, 3)
    with pytest.raises(ValueError, match="multiple of 32"):
        amx.pack(w)
    assert Projection(w).amx is None  # such a weight stays on oneDNN
    w, x = _w_x(64, 64, 3)
    with pytest.raises(ValueError, match="input has 32 features"):
        amx(x[:, :32], amx.pack(w), 64)
    with pytest.raises(TypeError, match="2-D bf16"):
        amx(x.float(), amx.pack(w), 64)


def test_disabled_means_onednn(tmp_path):
    code = ("import torch; from eagle_trt.models import native_gemm; from eagle_trt.models.gemm import Projection; "
            "assert native_gemm.load() is None; "
            "assert Projection(torch.randn(64, 64).bfloat16()).amx is None; print('ok')")
    env = dict(os.environ, EAGLE_TRT_NATIVE="0", EAGLE_TRT_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@needs_amx
def test_writes_into_a_given_buffer_of_its_shape():
    w, x = _w_x(64, 96, 5)
    packed = amx.pack(w)
    buf = torch.empty(5, 96, dtype=torch.bfloat16)
    got = amx(x, packed, 96, buf)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, amx(x, packed, 96))
    with pytest.raises(ValueError, match=r"out must be .* shape \[5, 96\], got torch.bfloat16 \[4, 96\]"):
        amx(x, packed, 96, torch.empty(4, 96, dtype=torch.bfloat16))


@needs_amx
@pytest.mark.parametrize("k,n", [(32, 16), (576, 960), (64, 40), (64, 80), (96, 1000)])
@pytest.mark.parametrize("m", [1, 5, 8, 12, 16, 17, 33])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fused_argmax_is_the_argmax_of_the_stored_product(k, n, m, threads):
    """The greedy step's LM head: the argmax of what the kernel would store, at any row and thread count (8 to 16
    rows take two column groups at a time)."""
    w, x = _w_x(k, n, m, seed=k + n + m)
    packed = amx.pack(w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.equal(amx.argmax(x, packed, n), amx(x, packed, n).argmax(dim=-1))
    finally:
        torch.set_num_threads(before)


@needs_amx
def test_fused_argmax_breaks_ties_and_reads_nan_as_torch_does():
    w, x = _w_x(64, 200, 4, seed=3)
    w[:, 150] = w[:, 7]  # an exact tie across the threads' column ranges: the first column wins
    w[:, 8] = w[:, 7]
    x[1] = 0  # a row of zeros: every logit ties at 0
    packed = amx.pack(w)
    want = amx(x, packed, 200)
    got = amx.argmax(x, packed, 200)
    assert torch.equal(got, want.argmax(dim=-1)) and int(got[1]) == 0
    w[3, 120] = float("nan")  # NaN logits in every row with a nonzero x[:, 3]
    w[3, 180] = float("nan")
    packed = amx.pack(w)
    assert torch.equal(amx.argmax(x, packed, 200), amx(x, packed, 200).argmax(dim=-1))
    p = Projection(w)
    assert torch.equal(p.argmax(x), p(x).argmax(dim=-1))
