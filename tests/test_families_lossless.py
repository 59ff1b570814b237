"""Losslessness per family on tiny random models made by transformers' own configs (fp32): Qwen3 (q/k norms),
Llama 3.x (rope_type llama3) and Gemma 3 (sandwich and (1 + w) norms, GELU-tanh, scaled embeddings, query scale,
sliding-window layers shorter than the prompts). Plain greedy equals HF `generate`, and speculative decoding equals
plain greedy, on the compiled kernels and on the torch reference, with an oracle drafter planting the true
continuation so deep paths are accepted, compacted and stopped mid-path (a tree row then sees its ancestors, and the
prefix, only inside the window).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import write_random_head
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.kernels import choose_kernels
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.models.reference import TorchKernels
from eagle_trt.models.spec import TargetSpec
from eagle_trt.models.weights import LazyTensors, read_json
from eagle_trt.runtime.runner import Runner
from eagle_trt.timing import TickClock
from lossless_support import OracleDrafter, assert_lossless

FAMILIES = ("qwen3", "llama3", "gemma3")
PROMPTS = [[5, 6, 7, 8, 9], [256, 72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101], list(range(40, 73))]
TREES = [dict(tree="dynamic", beam_width=4, draft_length=5, total_tokens=20), dict(tree="chain", draft_length=5)]


def load(model_dir, kernels: str, spec: TargetSpec | None = None) -> LlamaTarget:
    if kernels == "native" and spec is None:
        return LlamaTarget.load(model_dir)
    spec = spec or TargetSpec.from_hf_config(read_json(model_dir / "config.json"))
    chosen = TorchKernels(torch.float32) if kernels == "torch" else choose_kernels(torch.float32, spec)
    return LlamaTarget.from_state_dict(spec, LazyTensors(model_dir, torch.float32), torch.float32, kernels=chosen)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, family_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    model_dir = family_model_dir(request.param)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return request.param, model_dir, hf, write_random_head(tmp_path_factory.mktemp("head") / "draft")


def hf_greedy(model, prompt, n, eos=None):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_eagle_equals_ar_equals_hf(family, kernels):
    name, model_dir, hf, head_dir = family
    target = load(model_dir, kernels)
    if kernels == "native" and target.kernels.name == "torch":
        pytest.skip(f"no native kernels here: {target.kernels.reason}")
    runner = Runner(target, Eagle3DraftHead.load(head_dir, target), capacity=256, clock=TickClock())
    for i, prompt in enumerate(PROMPTS):
        ar = runner.generate(prompt, DecodeConfig(max_new_tokens=40, mode="ar", eos_token_ids=[])).token_ids
        assert ar == hf_greedy(hf, prompt, 40), (name, prompt)
        for tree in TREES:
            res = runner.generate(prompt, DecodeConfig(max_new_tokens=40, eos_token_ids=[], **tree))
            assert_lossless(runner, prompt, res.token_ids, ar, f"{name} {tree['tree']}")
        real = runner.drafter
        runner.drafter = OracleDrafter(real, len(prompt), ar, seed=i)
        try:
            res = runner.generate(prompt, DecodeConfig(max_new_tokens=40, eos_token_ids=[]))
            assert_lossless(runner, prompt, res.token_ids, ar, f"{name} oracle")
            assert res.metrics.acceptance_length > 1.5  # the planted paths were taken
            eos = ar[17 + i]  # an end token inside an accepted path: the output ends right after it, as HF's
            sd = runner.generate(prompt, DecodeConfig(max_new_tokens=40, eos_token_ids=[eos]))
            assert sd.token_ids == hf_greedy(hf, prompt, 40, eos=eos) and sd.metrics.stop_reason == "eos"
        finally:
            runner.drafter = real


def test_bf16_native_eagle_equals_ar(family):
    """Row invariance in bf16: speculative output equals plain greedy token for token."""
    name, model_dir, _, head_dir = family
    target = LlamaTarget.load(model_dir, torch.bfloat16)
    if not target.row_invariant:
        pytest.skip(f"{target.kernels.name} kernels are not row-invariant here")
    runner = Runner(target, Eagle3DraftHead.load(head_dir, target, torch.bfloat16), capacity=256,
                    clock=TickClock())
    prompt = PROMPTS[2]
    ar = runner.generate(prompt, DecodeConfig(max_new_tokens=40, mode="ar", eos_token_ids=[])).token_ids
    runner.drafter = OracleDrafter(runner.drafter, len(prompt), ar, seed=5)
    res = runner.generate(prompt, DecodeConfig(max_new_tokens=40, eos_token_ids=[]))
    assert res.token_ids == ar and res.metrics.acceptance_length > 1.5, name


# Each feature, taken away, changes the greedy output on these prompts: the equality above could not pass without it.
MUTATIONS = {
    "qwen3": [dict(qk_norm=False)],
    "llama3": [dict(rope_scaling=None)],
    "gemma3": [dict(local_layers=()), dict(rope_local_theta=1e6), dict(embed_scale=None), dict(norm_plus_one=False),
               dict(sandwich_norms=False),
               dict(attention_scale=None), dict(activation="silu")],
}


@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_each_family_feature_matters(family, kernels):
    name, model_dir, hf, _ = family
    spec = TargetSpec.from_hf_config(read_json(model_dir / "config.json"))
    prompt = PROMPTS[2]
    want = hf_greedy(hf, prompt, 24)
    for change in MUTATIONS[name]:
        target = load(model_dir, kernels, dataclasses.replace(spec, **change))
        cache = target.new_cache(128)
        hidden, _ = target.hidden_states(torch.tensor(prompt + want), torch.arange(len(prompt) + 24), cache)
        got = target.greedy(hidden[len(prompt) - 1:-1]).tolist()
        assert got != want, (name, change)
