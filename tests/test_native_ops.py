"""The bf16 layer's fused row ops (models/native_ops.py): torch's values, and each row's bits a function of that
row alone (any row count, any thread count), so a verify row still equals decoding that token alone."""

import pytest
import torch
import torch.nn.functional as F

from eagle_trt.models import native_ops
from eagle_trt.models.layers import Rope, rms_norm
from eagle_trt.models.llama import LlamaTarget, pick_row_ops

ops = native_ops.load()
needs_ops = pytest.mark.skipif(ops is None, reason="no C++ compiler: the layer runs on torch operators here")
BF = torch.bfloat16


def _randn(*shape, seed, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(BF)


def _ulps(a, b):
    """Distance in bf16 units in the last place, element-wise (same-sign values)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


@needs_ops
@pytest.mark.parametrize("t", [1, 5, 70])
def test_add_rms_norm_matches_torch(t):
    x, delta = _randn(t, 576, seed=t), _randn(t, 576, seed=t + 1, scale=0.5)
    w = (1 + _randn(576, seed=2, scale=0.2).float()).to(BF)
    got_x = x.clone()
    h = ops.add_rms_norm(got_x, delta, w, 1e-5)
    assert torch.equal(got_x, x + delta)  # the residual add rounds as torch's bf16 add does
    ref = rms_norm(x + delta, w, 1e-5)
    # The sum of squares runs in this kernel's fixed order, not torch's: at most a last-bit difference, rarely.
    assert _ulps(h, ref).max() <= 1 and (h != ref).float().mean() < 1e-3
    plain = x.clone()
    h = ops.add_rms_norm(plain, None, w, 1e-5)  # no delta: x stays as it is
    assert torch.equal(plain, x) and _ulps(h, rms_norm(x, w, 1e-5)).max() <= 1


@needs_ops
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("t", [1, 7, 70])
def test_rope_qkv_matches_torch_and_writes_only_its_rows(t, bias):
    h, hkv, d, start = 9, 3, 64, 40
    qkv = _randn(t, (h + 2 * hkv) * d, seed=t)
    b = _randn((h + 2 * hkv) * d, seed=99) if bias else None
    rope = Rope(d, 100000.0, None, 512, BF)
    cos, sin = rope.tables(torch.arange(start, start + t))
    k_cache = torch.full((hkv, 256, d), 7.0, dtype=BF)
    v_cache = torch.full((hkv, 256, d), 7.0, dtype=BF)
    q = ops.rope_qkv(qkv, b, cos, sin, k_cache, v_cache, start, h, hkv)
    full = qkv + b if bias else qkv
    qk = rope.rotate(full[:, :(h + hkv) * d].reshape(t, h + hkv, d).transpose(0, 1), cos, sin)
    assert torch.equal(q, qk[:h])
    assert torch.equal(k_cache[:, start:start + t], qk[h:])
    assert torch.equal(v_cache[:, start:start + t], full[:, (h + hkv) * d:].reshape(t, hkv, d).transpose(0, 1))
    for c in (k_cache, v_cache):  # nothing outside the written rows
        assert (c[:, :start] == 7).all() and (c[:, start + t:] == 7).all()


@needs_ops
@pytest.mark.parametrize("t", [1, 3, 70])
def test_silu_mul_matches_torch(t):
    gu = _randn(t, 2 * 1536, seed=t, scale=4.0)  # gates far into both tails
    gate, up = gu.chunk(2, dim=-1)
    ref = F.silu(gate) * up
    got = ops.silu_mul(gu)
    assert got.shape == (t, 1536) and _ulps(got, ref).max() <= 1 and (got != ref).float().mean() < 1e-3


@needs_ops
def test_every_row_equals_that_row_alone_at_any_thread_count():
    t = 70  # above the row count where a call splits its rows over threads
    x, delta, w = _randn(t, 576, seed=1), _randn(t, 576, seed=2), _randn(576, seed=3)
    gu = _randn(t, 3072, seed=4, scale=3.0)
    qkv, rope = _randn(t, 15 * 64, seed=5), Rope(64, 10000.0, None, 256, BF)
    cos, sin = rope.tables(torch.arange(t))

    def run_all(rows):
        xs = x[rows].clone()
        kc, vc = torch.zeros(3, 128, 64, dtype=BF), torch.zeros(3, 128, 64, dtype=BF)
        q = ops.rope_qkv(qkv[rows], None, cos[rows], sin[rows], kc, vc, 0, 9, 3)
        return ops.add_rms_norm(xs, delta[rows], w, 1e-5), xs, ops.silu_mul(gu[rows]), q.transpose(0, 1), kc

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


@needs_ops
def test_rejects_bad_input():
    x = torch.randn(2, 576)
    with pytest.raises(TypeError, match="bf16"):
        ops.add_rms_norm(x, None, torch.ones(576, dtype=BF), 1e-5)
    with pytest.raises(ValueError, match=r"weight must be \[576\]"):
        ops.add_rms_norm(x.to(BF), None, torch.ones(575, dtype=BF), 1e-5)
    rope = Rope(64, 10000.0, None, 64, BF)
    cos, sin = rope.tables(torch.arange(4))
    kc = torch.zeros(3, 8, 64, dtype=BF)
    with pytest.raises(RuntimeError, match="KV cache full: need 10 slots, capacity 8"):
        ops.rope_qkv(_randn(4, 15 * 64, seed=0), None, cos, sin, kc, kc.clone(), 6, 9, 3)
    with pytest.raises(ValueError, match="k_cache must be a bf16"):
        ops.rope_qkv(_randn(4, 15 * 64, seed=0), None, cos, sin, kc.float(), kc, 0, 9, 3)


def test_only_bf16_targets_use_them(tiny_model_dir):
    fp32 = LlamaTarget.load(tiny_model_dir, dtype=torch.float32)
    assert fp32.row_ops is None and pick_row_ops(torch.float32, torch.device("cpu"), fp32.spec) is None
    assert pick_row_ops(torch.bfloat16, torch.device("cpu"), fp32.spec) is ops  # None where there is no compiler


@needs_ops
def test_fused_target_forward_matches_the_torch_operators(tiny_model_dir):
    """Same logits and EAGLE-3 features as the torch operators, up to the norms' last-bit differences."""
    target = LlamaTarget.load(tiny_model_dir, dtype=BF)
    assert target.row_ops is ops
    target.aux_layer_ids = [0, target.spec.num_layers - 1]
    ids = torch.randint(0, target.spec.vocab_size, (20,), generator=torch.Generator().manual_seed(0))
    outs = []
    for row_ops in (ops, None):
        target.row_ops = row_ops
        cache = target.new_cache(32)
        outs.append(target.forward(ids, torch.arange(20), cache, need_aux=True) + (cache.k[:, :, :20].clone(),))
    for a, b in zip(outs[0], outs[1]):
        torch.testing.assert_close(a.float(), b.float(), atol=0.1, rtol=0.05)


@needs_ops
def test_fused_draft_head_matches_the_torch_operators(tiny_model_dir, tiny_head_dir):
    from eagle_trt.models.draft_head import Eagle3DraftHead

    target = LlamaTarget.load(tiny_model_dir, dtype=BF)
    head = Eagle3DraftHead.load(tiny_head_dir, target, BF)
    assert head.row_ops is ops
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(6, target.spec.hidden_size, generator=g).to(BF)
    ids = torch.randint(0, target.spec.vocab_size, (6,), generator=g)
    outs = []
    for row_ops in (ops, None):
        head.row_ops = row_ops
        cache = head.new_cache(16)
        before = feats.clone()
        outs.append(head.forward(feats, ids, torch.arange(6), cache, 0) + (cache.k[:, :, :6].clone(),))
        assert torch.equal(feats, before)  # the caller's features are not touched
    for a, b in zip(outs[0], outs[1]):
        torch.testing.assert_close(a.float(), b.float(), atol=0.1, rtol=0.05)


@needs_ops
def test_argmax_is_torchs():
    logits = _randn(9, 1000 + 7, seed=3, scale=3.0)
    logits[1, 5] = logits[1, 900] = 50.0  # a tie: the first index
    logits[2, -1] = 60.0  # in the tail past the last full vector
    logits[3, 400] = float("nan")  # NaN counts as the largest
    logits[4, :] = -1.0
    assert torch.equal(ops.argmax(logits), logits.argmax(dim=-1))
    assert ops.argmax(logits)[1] == 5 and ops.argmax(logits)[3] == 400


@needs_ops
def test_ops_write_into_given_buffers():
    """A forward passes one buffer per intermediate and reuses it across layers: same values, same storage."""
    x, delta, w = _randn(3, 576, seed=1), _randn(3, 576, seed=2), _randn(576, seed=3)
    gu = _randn(3, 3072, seed=4)
    h_buf, a_buf = torch.empty(3, 576, dtype=BF), torch.empty(3, 1536, dtype=BF)
    h = ops.add_rms_norm(x.clone(), delta, w, 1e-5, out=h_buf)
    assert h.data_ptr() == h_buf.data_ptr() and torch.equal(h, ops.add_rms_norm(x.clone(), delta, w, 1e-5))
    a = ops.silu_mul(gu, out=a_buf)
    assert a.data_ptr() == a_buf.data_ptr() and torch.equal(a, ops.silu_mul(gu))
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.bfloat16 CPU tensor of shape \[3, 1536\]"):
        ops.silu_mul(gu, out=torch.empty(2, 1536, dtype=BF))
