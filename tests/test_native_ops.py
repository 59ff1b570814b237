"""The layer's fused row ops (models/native/ops.py): torch's values (bf16: its bits for the adds, RoPE and the
products), and each row's bits a function of that row alone (any row count, any thread count), for fp32 and bf16,
on every build this machine runs."""

import pytest
import torch
import torch.nn.functional as F

from eagle_trt.models.layers import Rope, rms_norm
from eagle_trt.models.native import ops
from native_support import build_names, lib_or_skip

BF = torch.bfloat16
DTYPES = [torch.float32, BF]


def _randn(*shape, seed, scale=1.0, dtype=BF):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _ulps(a, b):
    """Distance in units in the last place, element-wise (same-sign values)."""
    view = torch.int16 if a.dtype == BF else torch.int32
    return (a.view(view).long() - b.view(view).long()).abs()


def _close(got, ref, max_ulps=1, share=1e-3):
    """At most `max_ulps` apart, and apart at all in at most `share` of the elements (bf16) or all of them (fp32,
    whose own orders of summation and exp differ from torch's in the last bits)."""
    d = _ulps(got, ref)
    assert d.max() <= (max_ulps if got.dtype == BF else 8), d.max()
    if got.dtype == BF:
        assert (got != ref).float().mean() < share


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 5, 70])
def test_add_rms_norm_matches_torch(build, dtype, t):
    lib = lib_or_skip(build)
    x, delta = _randn(t, 576, seed=t, dtype=dtype), _randn(t, 576, seed=t + 1, scale=0.5, dtype=dtype)
    w = (1 + _randn(576, seed=2, scale=0.2).float()).to(dtype)
    got_x = x.clone()
    h = ops.add_rms_norm(lib, got_x, delta, w, 1e-5)
    assert torch.equal(got_x, x + delta)  # the residual add rounds as torch's add does
    # The sum of squares runs in this kernel's fixed order, not torch's: at most a last-bit difference.
    _close(h, rms_norm(x + delta, w, 1e-5))
    plain = x.clone()
    h = ops.add_rms_norm(lib, plain, None, w, 1e-5)  # no delta: x stays as it is
    assert torch.equal(plain, x)
    _close(h, rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_rope_qkv_matches_torch_and_writes_only_its_rows(build, dtype, bias):
    lib = lib_or_skip(build)
    h, hkv, d, start = 9, 3, 64, 40
    for t in (1, 7, 70):
        qkv = _randn(t, (h + 2 * hkv) * d, seed=t, dtype=dtype)
        b = _randn((h + 2 * hkv) * d, seed=99, dtype=dtype) if bias else None
        rope = Rope(d, 100000.0, None, 512, dtype)
        cos, sin = rope.tables(torch.arange(start, start + t))
        k_cache = torch.full((hkv, 256, d), 7.0, dtype=dtype)
        v_cache = torch.full((hkv, 256, d), 7.0, dtype=dtype)
        q = ops.rope_qkv(lib, qkv, b, cos, sin, k_cache, v_cache, start, h, hkv)
        full = qkv + b if bias else qkv
        qk = rope.rotate(full[:, :(h + hkv) * d].reshape(t, h + hkv, d).transpose(0, 1), cos, sin)
        assert torch.equal(q, qk[:h])
        assert torch.equal(k_cache[:, start:start + t], qk[h:])
        assert torch.equal(v_cache[:, start:start + t], full[:, (h + hkv) * d:].reshape(t, hkv, d).transpose(0, 1))
        for c in (k_cache, v_cache):  # nothing outside the written rows
            assert (c[:, :start] == 7).all() and (c[:, start + t:] == 7).all()


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_torch(build, dtype):
    lib = lib_or_skip(build)
    for t in (1, 3, 70):
        gu = _randn(t, 2 * 1536 + 2 * 5, seed=t, scale=4.0, dtype=dtype)  # gates far into both tails; a lane tail
        gate, up = gu.chunk(2, dim=-1)
        got = ops.silu_mul(lib, gu)
        assert got.shape == (t, 1541)
        _close(got, F.silu(gate) * up)


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_row_equals_that_row_alone_at_any_thread_count(build, dtype):
    lib = lib_or_skip(build)
    t = 70  # above the row count where a call splits its rows over threads
    x, delta, w = (_randn(t, 576, seed=1, dtype=dtype), _randn(t, 576, seed=2, dtype=dtype),
                   _randn(576, seed=3, dtype=dtype))
    gu = _randn(t, 3072, seed=4, scale=3.0, dtype=dtype)
    qkv, rope = _randn(t, 15 * 64, seed=5, dtype=dtype), Rope(64, 10000.0, None, 256, dtype)
    cos, sin = rope.tables(torch.arange(t))

    def run_all(rows):
        xs = x[rows].clone()
        kc, vc = torch.zeros(3, 128, 64, dtype=dtype), torch.zeros(3, 128, 64, dtype=dtype)
        q = ops.rope_qkv(lib, qkv[rows], None, cos[rows], sin[rows], kc, vc, 0, 9, 3)
        return ops.add_rms_norm(lib, xs, delta[rows], w, 1e-5), xs, ops.silu_mul(lib, gu[rows]), q.transpose(0, 1), kc

    threads = torch.get_num_threads()
    try:
        together = run_all(slice(0, t))
        torch.set_num_threads(1)
        assert all(torch.equal(a, b) for a, b in zip(together, run_all(slice(0, t))))
    finally:
        torch.set_num_threads(threads)
    for row in (0, 17, t - 1):
        alone = run_all(slice(row, row + 1))
        for a, b in zip(together[:4], alone[:4]):
            assert torch.equal(a[row], b[0])
        assert torch.equal(together[4][:, row], alone[4][:, 0])


@pytest.mark.parametrize("build", build_names())
def test_rejects_bad_input(build):
    lib = lib_or_skip(build)
    x = torch.randn(2, 576)
    with pytest.raises(TypeError, match="weight is torch.bfloat16"):
        ops.add_rms_norm(lib, x, None, torch.ones(576, dtype=BF), 1e-5)
    with pytest.raises(ValueError, match=r"weight must be \[576\]"):
        ops.add_rms_norm(lib, x.to(BF), None, torch.ones(575, dtype=BF), 1e-5)
    rope = Rope(64, 10000.0, None, 64, BF)
    cos, sin = rope.tables(torch.arange(4))
    kc = torch.zeros(3, 8, 64, dtype=BF)
    with pytest.raises(RuntimeError, match="KV cache full: need 10 slots, capacity 8"):
        ops.rope_qkv(lib, _randn(4, 15 * 64, seed=0), None, cos, sin, kc, kc.clone(), 6, 9, 3)
    with pytest.raises(ValueError, match="k_cache must be a torch.bfloat16"):
        ops.rope_qkv(lib, _randn(4, 15 * 64, seed=0), None, cos, sin, kc.float(), kc, 0, 9, 3)
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.float32 CPU tensor of shape \[2, 576\]"):
        ops.add_rms_norm(lib, x, None, torch.ones(576), 1e-5, out=torch.empty(3, 576))


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_is_torchs(build, dtype):
    lib = lib_or_skip(build)
    logits = _randn(9, 1000 + 7, seed=3, scale=3.0, dtype=dtype)
    logits[1, 5] = logits[1, 900] = 50.0  # a tie: the first index
    logits[2, -1] = 60.0  # in the tail past the last full vector
    logits[3, 400] = float("nan")  # NaN counts as the largest
    logits[4, :] = -1.0
    got = ops.argmax(lib, logits)
    assert torch.equal(got, logits.argmax(dim=-1)) and got[1] == 5 and got[3] == 400


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_logp_is_torch_s_log_softmax_top_k(build, dtype):
    """Drafting's top-k in one compiled pass: torch's ids and, to float rounding, its log-probs; ties to the earlier
    id; k above the vocabulary gives the whole row."""
    lib = lib_or_skip(build)
    g = torch.Generator().manual_seed(5)
    # Distinct integers (exact in bf16), so torch's order is defined; then a planted tie.
    logits = (torch.stack([torch.randperm(250, generator=g) - 125 for _ in range(4)]) / 16).to(dtype)
    logits[2, 200] = logits[2, 30] = logits[2].max() + 1  # a tie for the top: 30 first
    for k in (1, 2, 8):
        vals, idx = ops.top_logp(lib, logits, k)
        want_vals, want_idx = torch.log_softmax(logits.float(), -1).topk(k, dim=-1)
        torch.testing.assert_close(vals, want_vals, atol=1e-5, rtol=1e-5)
        assert torch.equal(idx[[0, 1, 3]], want_idx[[0, 1, 3]])
        assert int(idx[2, 0]) == 30 and (k == 1 or int(idx[2, 1]) == 200)
    vals, idx = ops.top_logp(lib, logits[:, :5], 9)
    assert vals.shape == (4, 5) and sorted(idx[0].tolist()) == [0, 1, 2, 3, 4]
    torch.testing.assert_close(vals.exp().sum(-1), torch.ones(4), atol=1e-3, rtol=0)
