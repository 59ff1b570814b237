"""Draft-model speculative decoding on tiny random models that share a tokenizer: a small LM drafts (chain, dynamic
and static trees) and the target verifies; greedy output == plain AR == HF transformers' greedy generate.

Three drafts for one target: the target's own weights (every draft token is right: deep acceptance, an EOS inside an
accepted path, a stop at max_new_tokens mid-path), the target with noise on its weights (some right, some wrong) and
an unrelated smaller model (other depth, width and heads: almost all wrong).
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle_trt.errors import InputError
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.model_drafter import DraftModel, ModelDrafter
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.runner import Runner
from eagle_trt.timing import TickClock
from lossless_support import assert_lossless

PROMPTS = [[5, 6, 7, 8, 9], [100, 20, 30], [256, 72, 101, 108, 108, 111]]
TREES = [
    dict(tree="chain", draft_length=5),
    dict(tree="dynamic", beam_width=4, draft_length=5, total_tokens=16),
    dict(tree="dynamic", beam_width=1, draft_length=1, total_tokens=1),
    dict(tree="dynamic", beam_width=3, draft_length=4, total_tokens=8, confidence_threshold=0.05),
    dict(tree="static", static_tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
    dict(tree="dynamic", beam_width=2, draft_length=3, total_tokens=6, lookup_tokens=4, lookup_branches=2),
]
tree_id = lambda t: "-".join(f"{v}" for v in t.values())[:40]  # noqa: E731


def noisy_copy(src, out, scale: float, seed: int = 0):
    """The model at src with Gaussian noise (scale x each tensor's std) on every weight, tokenizer and config kept."""
    shutil.copytree(src, out)
    g = torch.Generator().manual_seed(seed)
    w = load_file(str(src / "model.safetensors"))
    noisy = {k: t + torch.randn(t.shape, generator=g) * t.std() * scale if t.numel() > 1 else t for k, t in w.items()}
    save_file(noisy, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def drafts(tiny_model_dir, tmp_path_factory):
    from make_tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("drafts")
    return {
        "same": tiny_model_dir,
        "noisy": noisy_copy(tiny_model_dir, root / "noisy", 0.05),
        "small": make_tiny_model(root / "small", seed=5, num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16),
    }


def model_runner(target, draft_dir, capacity=512) -> Runner:
    drafter = ModelDrafter(DraftModel.load(draft_dir), capacity, target.spec.vocab_size)
    # The configured trees (no step budget of its own): these tests check what a draft model's drafts bring.
    return Runner(target, None, capacity=capacity, drafter=drafter, clock=TickClock(), budget=False)


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return LlamaTarget.load(tiny_model_dir)


@pytest.fixture(scope="module")
def runners(target, drafts):
    return {name: model_runner(target, d) for name, d in drafts.items()}


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def hf_greedy(model, prompt, n, eos=None):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def ar(runner, prompt, n, eos=()):
    return runner.generate(prompt, DecodeConfig(max_new_tokens=n, mode="ar", eos_token_ids=list(eos))).token_ids


@pytest.mark.parametrize("draft", ["same", "noisy", "small"])
@pytest.mark.parametrize("tree", TREES, ids=tree_id)
def test_draft_model_equals_ar_and_hf(runners, hf_model, draft, tree):
    runner = runners[draft]
    for prompt in PROMPTS:
        reference = hf_greedy(hf_model, prompt, 40)
        assert ar(runner, prompt, 40) == reference
        for n in (1, 7, 40):
            res = runner.generate(prompt, DecodeConfig(max_new_tokens=n, eos_token_ids=[], **tree))
            assert res.token_ids == reference[:n], (prompt, n)
            assert res.metrics.stop_reason == "length" and res.metrics.mode == "eagle"


def test_acceptance_follows_the_draft(runners):
    """The target's own weights as draft: every draft token is accepted; an unrelated model: few are."""
    opts = DecodeConfig(max_new_tokens=40, eos_token_ids=[], tree="chain", draft_length=4, fallback_after=0,
                        lookup_tokens=0)  # the draft alone: no copies
    same = runners["same"].generate(PROMPTS[0], opts).metrics
    assert same.acceptance_length > 4.5 and same.rejections == 0  # 4 drafts + the bonus, bar the cut at the end
    noisy = runners["noisy"].generate(PROMPTS[0], opts).metrics
    assert 1.3 < noisy.acceptance_length < 4 and noisy.rejections == 0  # greedy: a miss ends the path, no rejection
    assert runners["small"].generate(PROMPTS[0], opts).metrics.acceptance_length < 1.5


@pytest.mark.parametrize("tree", TREES[:2], ids=["chain", "dynamic"])
def test_eos_inside_an_accepted_path(runners, hf_model, tree):
    runner = runners["same"]  # drafts are the target's own tokens: an EOS lands mid-path
    for prompt in PROMPTS:
        full = ar(runner, prompt, 40)
        for cut in (3, 9, 17):
            eos = full[cut]
            expected = hf_greedy(hf_model, prompt, 40, eos=eos)
            res = runner.generate(prompt, DecodeConfig(max_new_tokens=40, eos_token_ids=[eos], **tree))
            plain = ar(runner, prompt, 40, [eos])
            assert_lossless(runner, prompt, res.token_ids, plain)
            assert plain == expected
            assert res.token_ids[-1] == eos and res.metrics.stop_reason == "eos"
            assert res.metrics.discarded_tokens >= 0


def test_max_new_tokens_inside_an_accepted_path(runners):
    runner = runners["same"]
    prompt = PROMPTS[1]
    full = ar(runner, prompt, 40)
    for n in range(1, 13):  # every cut position of a 5-token chain, twice over
        res = runner.generate(prompt, DecodeConfig(max_new_tokens=n, eos_token_ids=[], tree="chain", draft_length=5))
        assert res.token_ids == full[:n] and res.metrics.stop_reason == "length"
        assert res.metrics.generated_tokens == n


def test_fallback_catches_the_draft_up(runners):
    """After repeated misses the loop decodes plainly; the draft model is then fed those tokens and drafts on."""
    runner = runners["small"]
    for prompt in PROMPTS:
        res = runner.generate(prompt, DecodeConfig(max_new_tokens=48, eos_token_ids=[], tree="chain", draft_length=3,
                                                    fallback_after=1, fallback_tokens=4))
        assert_lossless(runner, prompt, res.token_ids, ar(runner, prompt, 48))
    assert res.metrics.fallbacks > 0


def test_tree_mask_sees_ancestors_only(drafts):
    """A frontier node in a scratch slot gets the logits of decoding its own path alone, whatever sits beside it."""
    model = DraftModel.load(drafts["noisy"])
    prefix = [5, 6, 7, 8]
    cache = model.new_cache(64)
    model.hidden_states(torch.tensor(prefix), torch.arange(4), cache)
    cache.length = 4
    # Scratch slots 4, 5, 6: node a=10 (depth 1), b=11 (depth 1, sibling), then c=12 under a (depth 2).
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 0, 1]], dtype=torch.bool)
    cache.length = 4
    two, _ = model.hidden_states(torch.tensor([10, 11]), torch.tensor([4, 4]), cache, mask[:2, :6])
    cache.length = 6
    one, _ = model.hidden_states(torch.tensor([12]), torch.tensor([5]), cache, mask[2:, :7])
    for path, got in (([10], two[0]), ([11], two[1]), ([10, 12], one[0])):
        ref_cache = model.new_cache(64)
        seq = prefix + path
        h, _ = model.hidden_states(torch.tensor(seq), torch.arange(len(seq)), ref_cache)
        torch.testing.assert_close(model.logits(got[None]), model.logits(h[-1:]), rtol=1e-4, atol=1e-4)


def test_draft_with_a_shorter_context_caps_the_runner(tmp_path):
    from make_tiny_model import make_tiny_model

    target = LlamaTarget.load(make_tiny_model(tmp_path / "t", seed=3, max_position_embeddings=64))
    draft = make_tiny_model(tmp_path / "d", seed=4, max_position_embeddings=40)
    runner = model_runner(target, draft, capacity=256)
    assert runner.max_positions == 40
    prompt = [5, 6, 7, 8, 9]
    n = 40 - len(prompt)  # right up to the draft's last position
    res = runner.generate(prompt, DecodeConfig(max_new_tokens=n, eos_token_ids=[], tree="dynamic", beam_width=4,
                                                draft_length=6, total_tokens=16))
    assert_lossless(runner, prompt, res.token_ids, ar(runner, prompt, n))
    assert len(res.token_ids) == n
    with pytest.raises(InputError, match="context of 40 positions"):
        runner.generate(prompt, DecodeConfig(max_new_tokens=n + 1, eos_token_ids=[]))


def test_vocabularies_padded_to_different_sizes(tmp_path):
    """The draft's embedding table is padded past the target's vocabulary: it never proposes those ids."""
    from make_tiny_model import make_tiny_model

    target = LlamaTarget.load(make_tiny_model(tmp_path / "t", seed=0))
    draft = make_tiny_model(tmp_path / "d", seed=0, vocab_size=300, with_tokenizer=False)
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["vocab_size"] == 300
    runner = model_runner(target, draft)
    for prompt in PROMPTS:
        res = runner.generate(prompt, DecodeConfig(max_new_tokens=30, eos_token_ids=[], tree="dynamic",
                                                    beam_width=4, draft_length=4, total_tokens=12))
        assert_lossless(runner, prompt, res.token_ids, ar(runner, prompt, 30))


@pytest.mark.parametrize("fallback_after", [0, 2])
@pytest.mark.parametrize("tree", [TREES[0], TREES[1], TREES[4], TREES[5]], ids=["chain", "dynamic", "static", "lookup"])
def test_greedy_to_the_last_position_equals_ar(tmp_path_factory, tree, fallback_after):
    """Answers that end exactly at the context's last position (prompt + max_new_tokens == 48): the trees of the
    target's last steps and the draft model's scratch positions stay inside both RoPE tables."""
    from make_tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("short")
    target_dir = make_tiny_model(root / "t", seed=3, max_position_embeddings=48)
    runner = model_runner(LlamaTarget.load(target_dir), noisy_copy(target_dir, root / "d", 0.05), capacity=4 * 48)
    for prompt in ([5, 6, 7, 8, 9], [40, 41, 42, 43, 40, 41, 42, 43, 40, 41, 42]):
        n = 48 - len(prompt)
        res = runner.generate(prompt, DecodeConfig(max_new_tokens=n, eos_token_ids=[], fallback_after=fallback_after,
                                                    **tree))
        assert_lossless(runner, prompt, res.token_ids, ar(runner, prompt, n))
        assert len(res.token_ids) == n
        assert res.metrics.stop_reason == "length"


@pytest.mark.parametrize("draft", ["same", "noisy"])
@pytest.mark.parametrize("cost", [None, "cheap"], ids=["unsized", "cheap-rows"])
def test_batched_requests_accept_drafts_and_equal_their_solo_plain_answers(runners, draft, cost):
    """Continuous batching with drafts that get accepted (the target's own weights as draft model; a noisy copy):
    every request, arriving at different steps beside others, equals its solo --mode ar answer token for token, and
    the batch's verify passes accepted draft tokens (a lossless check over drafts that all miss proves little)."""
    from eagle_trt.runtime.loop import DecodeLoop
    from eagle_trt.speculative.step_budget import CostCurve

    runner = runners[draft]
    g = torch.Generator().manual_seed(3)
    prompts = [PROMPTS[i % len(PROMPTS)] + torch.randint(3, 250, (i,), generator=g).tolist() for i in range(5)]
    lengths = [30, 9, 24, 1, 40]
    solo = [ar(runner, p, n) for p, n in zip(prompts, lengths)]
    # Sized: a pass that costs far more than drafting (a clock tick) and rows that are nearly free, so the budget
    # drafts and keeps the trees, on the same footing as the unsized batch.
    curve = CostCurve({1: 1000.0, 64: 1001.0, 512: 1010.0}) if cost else None
    batch = DecodeLoop(runner, max_batch=3, cost=curve, size_trees=cost)
    cfg = [DecodeConfig(max_new_tokens=n, eos_token_ids=[], tree="dynamic", draft_length=4, beam_width=2,
                        total_tokens=8, lookup_tokens=0, fallback_after=0) for n in lengths]
    arrivals, waiting, slots, out, step = [0, 0, 2, 5, 6], list(range(5)), {}, {}, 0
    while waiting or batch.active:
        for i in [i for i in waiting if arrivals[i] <= step]:
            slot = batch.admit(prompts[i], cfg[i])
            if slot is None:
                break
            slots[i] = slot
            waiting.remove(i)
        for s in batch.step():
            out[next(i for i, x in slots.items() if x is s)] = s.request.output
        step += 1
        assert step < 2000
    assert [out[i] for i in range(5)] == solo
    accepted = sum(st.accepted for s in slots.values() for st in s.request.metrics.steps)
    # The target as its own draft, every request drafting its configured tree: most tokens come from accepted
    # drafts. Under the step budget (runtime/budget.py) a request drafts only where its drafting pays, fewer then.
    assert accepted > (sum(lengths) // 2 if draft == "same" and cost is None else 5), accepted
