"""Every set of kernels a machine can run keeps a verify row bit-identical to decoding that token alone: a T-token forward
equals T one-token forwards, for fp32 and bf16, on the compiled kernels (this machine's build and an AVX2 build
beside it) and on the torch reference where it claims so (bf16 on oneDNN with hardware bf16, float64 attention).
That is what keeps speculative output equal to plain decoding. Also the torch reference's projections."""

import pytest
import torch

from eagle_trt.models.kernels import choose_kernels
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.gemm import Projection, bf16_hardware, prepack_enabled
from eagle_trt.models.layers import additive_mask, attention, attention_fp64
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.models.native.kernels import NativeKernels
from eagle_trt.models.reference import TorchKernels
from eagle_trt.models.spec import TargetSpec
from eagle_trt.models.weights import load_safetensors, read_json
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.runner import Runner
from eagle_trt.timing import TickClock
from native_support import builds

needs_prepack = pytest.mark.skipif(not prepack_enabled(), reason="this torch build has no oneDNN prepacking")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def all_kernels() -> dict:
    """name -> (dtype -> kernels), for every set of kernels this machine runs (the AMX build's vector kernels too)."""
    out = {}
    for name, lib in builds().items():
        out[name] = lambda dtype, lib=lib, name=name: NativeKernels(lib, dtype, amx=name == "amx" and
                                                                    dtype == torch.bfloat16)
        if name == "amx":
            out["amx-build vectors"] = lambda dtype, lib=lib: NativeKernels(lib, dtype, amx=False)
    out["torch"] = lambda dtype: TorchKernels(dtype)
    return out


def load_target(model_dir, dtype, kernels=None) -> LlamaTarget:
    spec = TargetSpec.from_hf_config(read_json(model_dir / "config.json"))
    return LlamaTarget.from_state_dict(spec, load_safetensors(model_dir / "model.safetensors", dtype), dtype,
                                       kernels=kernels)


def verify_equals_decode(target: LlamaTarget, seed: int = 0) -> bool:
    """A 40-token forward after 24 cached tokens (past a 32-row call) against 40 one-token forwards: logits, every
    layer's output and every K/V entry written, bit for bit."""
    ids = torch.randint(0, target.spec.vocab_size, (64,), generator=torch.Generator().manual_seed(seed))
    caches = [target.new_cache(64), target.new_cache(64)]
    for c in caches:
        target.forward(ids[:24], torch.arange(24), c)
        c.length = 24
    kept, target.aux_layer_ids = target.aux_layer_ids, list(range(target.spec.num_layers))
    try:
        full = target.forward(ids[24:], torch.arange(24, 64), caches[0], need_aux=True)
        rows = []
        for j in range(24, 64):
            rows.append(target.forward(ids[j:j + 1], torch.tensor([j]), caches[1], need_aux=True))
            caches[1].length += 1
    finally:
        target.aux_layer_ids = kept
    return (all(torch.equal(f, torch.cat([r[i] for r in rows])) for i, f in enumerate(full))
            and all(torch.equal(a[:, :, :64], b[:, :, :64]) for a, b in zip((caches[0].k, caches[0].v),
                                                                            (caches[1].k, caches[1].v))))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(all_kernels()))
def test_verify_forward_is_bit_identical_to_decoding(tiny_model_dir, name, dtype):
    kernels = all_kernels()[name](DTYPES[dtype])
    if not kernels.row_invariant:
        pytest.skip(f"{name} {dtype} does not claim row invariance here (torch's fused attention and GEMMs, or no "
                    "hardware bf16 for oneDNN)")
    target = load_target(tiny_model_dir, DTYPES[dtype], kernels)
    assert target.row_invariant and target.kernels.name == kernels.name
    assert verify_equals_decode(target)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [n for n in all_kernels() if n != "torch"])
def test_kernels_agree_with_the_torch_reference(tiny_model_dir, name, dtype):
    """The oracle: the compiled forward's logits and features are the torch operators' up to rounding."""
    dt = DTYPES[dtype]
    ids = torch.randint(0, 260, (20,), generator=torch.Generator().manual_seed(1))
    outs = []
    for kernels in (all_kernels()[name](dt), TorchKernels(dt)):
        target = load_target(tiny_model_dir, dt, kernels)
        target.aux_layer_ids = [0, target.spec.num_layers - 1]
        cache = target.new_cache(32)
        outs.append(target.forward(ids, torch.arange(20), cache, need_aux=True) + (cache.k[:, :, :20].clone(),))
    tol = dict(atol=1e-4, rtol=1e-4) if dt == torch.float32 else dict(atol=0.1, rtol=0.05)
    for a, b in zip(*outs):
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_the_machine_s_backend_is_chosen_once(tiny_model_dir):
    target = LlamaTarget.load(tiny_model_dir, dtype=torch.bfloat16)
    head_backend = choose_kernels(torch.bfloat16, target.spec)
    assert target.kernels.name == head_backend.name
    if builds():
        lib = next(iter(builds().values()))
        assert target.kernels.name == lib.isa_name and target.row_invariant
        assert LlamaTarget.load(tiny_model_dir, dtype=torch.float32).kernels.name == (
            "avx2" if lib.isa_name == "avx2" else "avx512")
    else:
        assert target.kernels.name == "torch"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(2))
def test_eagle_equals_ar(tiny_model_dir, tiny_head_dir, dtype, seed):
    """On the machine's kernels, with planted continuations (deep acceptance, scattered tree slots) as well as the
    real head."""
    from test_lossless_tiny import OracleDrafter

    dt = DTYPES[dtype]
    target = LlamaTarget.load(tiny_model_dir, dtype=dt)
    if not target.row_invariant:
        pytest.skip(f"{target.kernels.name} {dtype} does not claim row invariance here")
    runner = Runner(target, Eagle3DraftHead.load(tiny_head_dir, target, dt), capacity=256, clock=TickClock())
    real = runner.drafter
    for prompt in ([5, 6, 7, 8, 9], [100, 20, 30]):
        ar = runner.generate(prompt, DecodeConfig(max_new_tokens=48, mode="ar", eos_token_ids=[])).token_ids
        tree = dict(tree="dynamic", beam_width=4, draft_length=5, total_tokens=16)
        assert runner.generate(prompt, DecodeConfig(max_new_tokens=48, eos_token_ids=[], **tree)).token_ids == ar
        runner.drafter = OracleDrafter(real, len(prompt), ar, seed)
        try:
            res = runner.generate(prompt, DecodeConfig(max_new_tokens=48, eos_token_ids=[], **tree))
        finally:
            runner.drafter = real
        assert res.token_ids == ar
        assert res.metrics.acceptance_length > 1.5


# ---- the torch reference's own pieces ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prepack", [False, True])
def test_projection_matches_matmul(dtype, prepack):
    if prepack and not prepack_enabled():
        pytest.skip("no oneDNN prepacking in this torch build")
    for rows in (1, 3, 16, 40):
        g = torch.Generator().manual_seed(rows)
        w = torch.randn(96, 200, generator=g).to(dtype)
        x = torch.randn(rows, 96, generator=g).to(dtype)
        p = Projection(w, prepack=prepack)
        # bf16 takes oneDNN's packed kernel where the CPU has hardware bf16; elsewhere the plain product serves.
        assert (p.packed is not None) == (prepack and (dtype == torch.float32 or bf16_hardware()))
        assert (p.in_features, p.out_features) == (96, 200)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.02)
        torch.testing.assert_close(p(x).float(), (x.float() @ w.float()), **tol)


@needs_prepack
@pytest.mark.skipif(not bf16_hardware(), reason="no hardware bf16 (or EAGLE_TRT_ISA hides it): oneDNN not packed")
def test_onednn_bf16_rows_do_not_depend_on_the_call_size():
    g = torch.Generator().manual_seed(0)
    p = Projection(torch.randn(576, 960, generator=g).bfloat16(), prepack=True)
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
    """The torch reference turns a forward's bool mask into additive_mask once and hands that to every layer."""
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
