"""Losslessness on a tiny random Llama: eagle == ar == HF transformers greedy generate (fp32).

An untrained head rarely gets a token right, so an "oracle" drafter also plants the true continuation
in the tree (at a random depth, among wrong siblings, sometimes with a wrong token mid-path): that drives
deep acceptance, KV compaction and stops in the middle of an accepted path.
"""

import pytest
import torch

from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.runner import Runner
from eagle_trt.timing import TickClock
from lossless_support import OracleDrafter, assert_lossless

PROMPTS = [[5, 6, 7, 8, 9], [100, 20, 30], [256, 72, 101, 108, 108, 111], list(range(40, 73))]
TREES = [
    dict(tree="dynamic", beam_width=8, draft_length=6, total_tokens=32),
    dict(tree="dynamic", beam_width=3, draft_length=4, total_tokens=6),
    dict(tree="dynamic", beam_width=1, draft_length=1, total_tokens=1),
    dict(tree="dynamic", beam_width=4, draft_length=5, total_tokens=20, confidence_threshold=0.01),
    dict(tree="static"),
    dict(tree="static", static_tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
    dict(tree="chain", draft_length=5),
]


@pytest.fixture(scope="module")
def runner(tiny_model_dir, tiny_head_dir):
    target = LlamaTarget.load(tiny_model_dir)
    # The configured trees (no step budget): these tests plant paths and check they are taken.
    return Runner(target, Eagle3DraftHead.load(tiny_head_dir, target), capacity=512, clock=TickClock(), budget=False)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def hf_greedy(model, prompt, n, eos=None):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_ar_equals_hf_generate(runner, hf_model, prompt):
    ar = runner.generate(prompt, DecodeConfig(max_new_tokens=48, mode="ar", eos_token_ids=[]))
    assert ar.token_ids == hf_greedy(hf_model, prompt, 48)


@pytest.mark.parametrize("tree", TREES, ids=lambda t: "-".join(f"{v}" for v in t.values())[:40])
@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_eagle_equals_ar(runner, prompt, tree):
    for n in (1, 7, 40):
        ar = runner.generate(prompt, DecodeConfig(max_new_tokens=n, mode="ar", eos_token_ids=[])).token_ids
        res = runner.generate(prompt, DecodeConfig(max_new_tokens=n, eos_token_ids=[], **tree))
        assert_lossless(runner, prompt, res.token_ids, ar)
        assert len(res.token_ids) == n and res.metrics.stop_reason == "length"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("prompt", PROMPTS)
def test_deep_acceptance_and_eos_mid_path(runner, hf_model, prompt, seed):
    ref = runner.generate(prompt, DecodeConfig(max_new_tokens=60, mode="ar", eos_token_ids=[])).token_ids
    real = runner.drafter
    runner.drafter = OracleDrafter(real, len(prompt), ref, seed)
    try:
        res = runner.generate(prompt, DecodeConfig(max_new_tokens=60, eos_token_ids=[]))
        assert_lossless(runner, prompt, res.token_ids, ref)
        assert res.metrics.acceptance_length > 1.5  # the planted paths were taken
        # Stop at an "EOS" that sits inside an accepted path: output ends right after it, like HF.
        eos = ref[17 + seed]
        hf = hf_greedy(hf_model, prompt, 60, eos=eos)
        ar = runner.generate(prompt, DecodeConfig(max_new_tokens=60, mode="ar", eos_token_ids=[eos]))
        sd = runner.generate(prompt, DecodeConfig(max_new_tokens=60, eos_token_ids=[eos]))
        assert_lossless(runner, prompt, sd.token_ids, ar.token_ids)
        assert ar.token_ids == hf
        assert sd.token_ids[-1] == eos and sd.metrics.stop_reason == "eos"
    finally:
        runner.drafter = real


def test_reduced_draft_vocab_maps_through_d2t(tiny_model_dir, tmp_path):
    from conftest import write_random_head

    target = LlamaTarget.load(tiny_model_dir)
    head = Eagle3DraftHead.load(write_random_head(tmp_path / "d", draft_vocab=64), target)
    assert head.draft_to_target.tolist() == [2 * i for i in range(64)]
    r = Runner(target, head, capacity=256, clock=TickClock())
    ar = r.generate([5, 6, 7], DecodeConfig(max_new_tokens=30, mode="ar", eos_token_ids=[])).token_ids
    res = r.generate([5, 6, 7], DecodeConfig(max_new_tokens=30, eos_token_ids=[]))
    assert_lossless(r, [5, 6, 7], res.token_ids, ar)
