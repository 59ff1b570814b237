"""A target whose projections and LM head are GGUF blocks keeps a verify row bit-identical to decoding that token
alone (every kernel build here, fp32 and bf16; the torch reference where it claims row invariance), and the compiled
kernels compute the reference's model (gguf-py's de-quantized weights) up to fp32 summation order."""

import pytest
import torch

from eagle_trt.engine import weight_blocks
from eagle_trt.models import block_weights
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.models.native.kernels import NativeKernels
from eagle_trt.models.reference import TorchKernels
from eagle_trt.models.spec import TargetSpec
from eagle_trt.models.weights import load_safetensors, read_json
from native_support import build_names, lib_or_skip
from test_gemm import DTYPES, verify_equals_decode


def block_target(model_dir, dtype, kernels, fmt: str, tied: bool = False) -> LlamaTarget:
    """The tiny model with its projections (and LM head) quantized to `fmt` as `build` does."""
    spec = TargetSpec.from_hf_config(read_json(model_dir / "config.json"))
    raw = load_safetensors(model_dir / "model.safetensors")
    if tied:
        raw.pop("lm_head.weight")
    plans = weight_blocks.plan({n: tuple(t.shape) for n, t in raw.items()}, fmt, tied=tied)
    tensors = {n: (t.to(dtype) if t.is_floating_point() else t) for n, t in raw.items() if n not in plans}
    tensors.update({n: weight_blocks.produce(p, lambda name, kept: raw[name]) for n, p in plans.items()})
    w = block_weights.BlockTensors(tensors, weight_blocks.table(plans), "tiny")
    return LlamaTarget.from_state_dict(spec, w, dtype, kernels=kernels)


@pytest.mark.parametrize("compute", ["float", "int8"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", build_names())
def test_verify_forward_on_blocks_is_bit_identical_to_decoding(tiny_model_dir, name, dtype, fmt, compute):
    lib = lib_or_skip(name)
    target = block_target(tiny_model_dir, DTYPES[dtype], NativeKernels(lib, DTYPES[dtype], block_compute=compute), fmt)
    assert target.layers[0].qkv.kernel == 2 and target.lm_head.kernel == 2
    assert target.lm_head.compute == compute
    assert verify_equals_decode(target, seed=1)


def test_the_torch_reference_on_blocks_where_it_claims_invariance(tiny_model_dir):
    kernels = TorchKernels(torch.bfloat16)
    if not kernels.row_invariant:
        pytest.skip("the torch reference is not row-invariant here (no hardware bf16 for oneDNN)")
    assert verify_equals_decode(block_target(tiny_model_dir, torch.bfloat16, kernels, "q4_1"), seed=2)


@pytest.mark.parametrize("name", build_names())
def test_native_blocks_compute_the_reference_model(tiny_model_dir, name):
    lib = lib_or_skip(name)
    fp32 = torch.float32
    native = block_target(tiny_model_dir, fp32, NativeKernels(lib, fp32), "q4_0", tied=True)
    ref = block_target(tiny_model_dir, fp32, TorchKernels(fp32), "q4_0", tied=True)
    ids = torch.randint(0, native.spec.vocab_size, (20,), generator=torch.Generator().manual_seed(3))
    a, _ = native.forward(ids, torch.arange(20), native.new_cache(32))
    b, _ = ref.forward(ids, torch.arange(20), ref.new_cache(32))
    assert (a - b).abs().max().item() < 1e-4 * b.abs().max().item()
    # The reference's LM head is the de-quantized blocks of the tied embeddings, not the float table.
    assert not torch.equal(ref.lm_head.w, ref.embed.t())


@pytest.mark.parametrize("name", build_names())
def test_native_int8_blocks_compute_the_int8_reference_model(tiny_model_dir, name):
    """With int8 activations the kernels and the reference (`Int8Reference`) compute the same integers; the model's
    logits agree up to the attention's and the fma's rounding, and differ from the float mode's by more."""
    lib = lib_or_skip(name)
    fp32 = torch.float32
    native = block_target(tiny_model_dir, fp32, NativeKernels(lib, fp32, block_compute="int8"), "q4_0", tied=True)
    ref = block_target(tiny_model_dir, fp32, TorchKernels(fp32, block_compute="int8"), "q4_0", tied=True)
    flt = block_target(tiny_model_dir, fp32, NativeKernels(lib, fp32), "q4_0", tied=True)
    ids = torch.randint(0, native.spec.vocab_size, (20,), generator=torch.Generator().manual_seed(3))
    a, _ = native.forward(ids, torch.arange(20), native.new_cache(32))
    b, _ = ref.forward(ids, torch.arange(20), ref.new_cache(32))
    c, _ = flt.forward(ids, torch.arange(20), flt.new_cache(32))
    err = (a - b).abs().max().item()
    assert err < 1e-4 * b.abs().max().item() and err < (a - c).abs().max().item()
