"""Prepacked projections and float64 attention: same values as the plain ops, and (for bf16) a T-token
forward bit-identical to T one-token forwards, which is what keeps a bf16 engine lossless."""

import pytest
import torch

from eagle_trt.models import native_attention, native_gemm
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.gemm import Projection, cpu_has_native_bf16, prepack_enabled
from eagle_trt.models.layers import additive_mask, attention, attention_fp64
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.runner import DecodeOptions, Runner

needs_prepack = pytest.mark.skipif(not prepack_enabled(), reason="this torch build has no oneDNN prepacking")
needs_bf16 = pytest.mark.skipif(not (prepack_enabled() and cpu_has_native_bf16()),
                                reason="CPU without AMX/AVX512-BF16: the bf16 engine is not offered here")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 16, 40])
@pytest.mark.parametrize("prepack", [False, True])
def test_projection_matches_matmul(dtype, rows, prepack):
    if prepack and not prepack_enabled():
        pytest.skip("no oneDNN prepacking in this torch build")
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 200, generator=g).to(dtype)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    p = Projection(w, prepack=prepack)
    # bf16 takes the AMX kernel where there is one, else oneDNN's packed one, which needs hardware bf16: on a CPU
    # without it (AVX2-only) the plain product serves, and only the values are checked.
    if dtype == torch.float32 or cpu_has_native_bf16():
        assert (p.packed is not None or p.amx is not None) == prepack
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.02)
    torch.testing.assert_close(p(x).float(), (x.float() @ w.float()), **tol)


@needs_prepack
@pytest.mark.parametrize("kernel", ["default", "onednn"])
def test_projection_rows_do_not_depend_on_the_call_size(kernel, monkeypatch):
    """bf16 always takes a packed kernel (AMX where there is one, else oneDNN's); each of its output rows must not
    depend on the other rows."""
    if kernel == "onednn":
        monkeypatch.setattr(native_gemm, "load", lambda: None)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(576, 960, generator=g).bfloat16()
    p = Projection(w, prepack=True)
    assert p.amx is None or kernel == "default"
    for rows in (17, 32, 33, 70):  # > 32 rows: oneDNN's other kernel, which Projection chunks around
        x = torch.randn(rows, 576, generator=g).bfloat16()
        full = p(x)
        for i in range(rows):
            assert torch.equal(full[i:i + 1], p(x[i:i + 1])), (rows, i)


def _qkv(t, s, h=6, hkv=2, d=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for shape in ((h, t, d), (hkv, s, d), (hkv, s, d))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp64_attention_matches_sdpa(dtype):
    q, k, v = _qkv(5, 12, dtype=dtype)
    mask = torch.rand(5, 12, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for m in (None, mask):
        torch.testing.assert_close(attention_fp64(q, k, v, m).float(), attention(q, k, v, m).float(), **tol)


def test_fp64_attention_ignores_key_order_and_masked_keys():
    """A tree row sees its ancestors at scattered slots among masked siblings; decoding the same token
    sees them contiguously. The float64 result, rounded, must be the same bits either way."""
    q, k, v = _qkv(1, 40, dtype=torch.bfloat16, seed=3)
    visible = torch.tensor([0, 1, 2, 3, 9, 17, 30])
    ref = attention_fp64(q, k[:, visible], v[:, visible], None)
    mask = torch.zeros(1, 40, dtype=torch.bool)
    mask[0, visible] = True
    assert torch.equal(attention_fp64(q, k, v, mask), ref)
    perm = visible[torch.randperm(visible.numel(), generator=torch.Generator().manual_seed(0))]
    assert torch.equal(attention_fp64(q, k[:, perm], v[:, perm], None), ref)


def test_fp64_attention_takes_its_mask_precomputed():
    """The target turns a forward's bool mask into additive_mask once and hands that to every layer."""
    q, k, v = _qkv(4, 10, h=6, hkv=2, dtype=torch.bfloat16, seed=5)
    mask = torch.rand(4, 10, generator=torch.Generator().manual_seed(2)) > 0.4
    mask[:, 0] = True
    bias = additive_mask(mask, groups=3)
    assert bias.shape == (12, 10) and bias.dtype == torch.float64
    assert torch.equal(bias[4:8] == 0, mask) and torch.isneginf(bias[~mask.repeat(3, 1)]).all()
    assert torch.equal(attention_fp64(q, k, v, bias), attention_fp64(q, k, v, mask))
    for row in range(4):  # each row as if decoded alone over its visible keys
        seen = mask[row].nonzero().flatten()
        alone = attention_fp64(q[:, row:row + 1], k[:, seen], v[:, seen], None)
        assert torch.equal(attention_fp64(q, k, v, bias)[row:row + 1], alone)


@needs_bf16
@pytest.mark.parametrize("attend", ["default", "layer-loop", "onednn", "torch-ops", "float64"])
def test_bf16_verify_forward_is_bit_identical_to_decoding(tiny_model_dir, attend, monkeypatch):
    """The default is every compiled kernel where a C++ compiler exists (the decoder stack in one call, AMX
    projections where the CPU has AMX, fused row ops, row-invariant attention). Each fallback must keep the property
    too: the same kernels called layer by layer from Python, oneDNN projections, then torch's row ops, then float64
    attention (the engine without a compiler)."""
    if attend not in ("default", "layer-loop"):
        monkeypatch.setattr(native_gemm, "load", lambda: None)
    if attend == "layer-loop":
        monkeypatch.setenv("EAGLE_TRT_STACK", "0")
    target = LlamaTarget.load(tiny_model_dir, dtype=torch.bfloat16)
    on_amx = attend == "default" and native_gemm.load() is not None
    assert (target.stack is not None) == on_amx
    kernel = native_attention.load()
    assert target.attend is (kernel if kernel is not None else attention_fp64)
    assert (target.row_ops is not None) == (kernel is not None)
    assert (target.layers[0].qkv.amx is not None) == (on_amx or (attend == "layer-loop" and native_gemm.load() is not None))
    if attend in ("torch-ops", "float64"):
        target.row_ops = None
    if attend == "float64":
        target.attend = attention_fp64
    ids = torch.randint(0, target.spec.vocab_size, (64,), generator=torch.Generator().manual_seed(0))
    caches = [target.new_cache(64), target.new_cache(64)]
    for c in caches:
        target.forward(ids[:24], torch.arange(24), c)
        c.length = 24
    full, _ = target.forward(ids[24:], torch.arange(24, 64), caches[0])  # 40 rows: past the 32-row kernel
    rows = []
    for j in range(24, 64):
        logits, _ = target.forward(ids[j:j + 1], torch.tensor([j]), caches[1])
        caches[1].length += 1
        rows.append(logits)
    assert torch.equal(full, torch.cat(rows))


@needs_bf16
@pytest.mark.parametrize("seed", range(3))
def test_bf16_eagle_equals_bf16_ar(tiny_model_dir, tiny_head_dir, seed):
    """With planted continuations (deep acceptance, scattered tree slots) as well as the real head."""
    from test_lossless_tiny import OracleDrafter

    target = LlamaTarget.load(tiny_model_dir, dtype=torch.bfloat16)
    runner = Runner(target, Eagle3DraftHead.load(tiny_head_dir, target, torch.bfloat16), capacity=256)
    real = runner.drafter
    for prompt in ([5, 6, 7, 8, 9], [100, 20, 30]):
        ar = runner.generate(prompt, DecodeOptions(max_new_tokens=48, mode="ar", eos_token_ids=[])).token_ids
        tree = dict(tree="dynamic", beam_width=4, draft_length=5, total_tokens=16)
        assert runner.generate(prompt, DecodeOptions(max_new_tokens=48, eos_token_ids=[], **tree)).token_ids == ar
        runner.drafter = OracleDrafter(real, len(prompt), ar, seed)
        try:
            res = runner.generate(prompt, DecodeOptions(max_new_tokens=48, eos_token_ids=[], **tree))
        finally:
            runner.drafter = real
        assert res.token_ids == ar
        assert res.metrics.acceptance_length > 1.5
