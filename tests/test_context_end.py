"""Decoding right up to the model's last position: the tree's depth and the prompt-lookup copies are cut to what still
fits, so a step near the end never reaches past the RoPE tables (which hold exactly max_position_embeddings rows).

A tiny model with a 48-position context and answers that end exactly there (prompt + max_new_tokens == 48)."""

import pytest

from eagle_trt.errors import InputError
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.runner import Runner
from eagle_trt.timing import TickClock

P = 48
# The second prompt repeats itself, so prompt lookup finds long copies right up to the end.
PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42, 43, 40, 41, 42, 43, 40, 41, 42]]
TREES = [
    dict(tree="dynamic", beam_width=4, draft_length=6, total_tokens=16),
    dict(tree="static"),
    dict(tree="chain", draft_length=5),
    dict(tree="dynamic", beam_width=4, draft_length=6, total_tokens=16, lookup_tokens=8, lookup_branches=2),
]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from conftest import write_random_head
    from make_tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("short")
    model = make_tiny_model(root / "model", seed=3, max_position_embeddings=P)
    target = LlamaTarget.load(model)
    head = Eagle3DraftHead.load(write_random_head(root / "draft"), target)
    return Runner(target, head, capacity=4 * P, clock=TickClock())  # copies cut by the step count, not the load


@pytest.mark.parametrize("fallback_after", [0, 2])
@pytest.mark.parametrize("tree", TREES, ids=lambda t: "-".join(f"{v}" for v in t.values())[:40])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["plain", "repetitive"])
def test_greedy_to_the_last_position_equals_ar(runner, prompt, tree, fallback_after):
    n = P - len(prompt)
    ar = runner.generate(prompt, DecodeConfig(max_new_tokens=n, mode="ar", eos_token_ids=[])).token_ids
    res = runner.generate(prompt, DecodeConfig(max_new_tokens=n, eos_token_ids=[], fallback_after=fallback_after,
                                                **tree))
    assert res.token_ids == ar and len(ar) == n
    assert res.metrics.stop_reason == "length"


@pytest.mark.parametrize("tree", TREES[::3], ids=["dynamic", "lookup"])
def test_sampling_to_the_last_position(runner, tree):
    prompt = PROMPTS[1]
    n = P - len(prompt)
    for seed in range(3):
        res = runner.generate(prompt, DecodeConfig(max_new_tokens=n, eos_token_ids=[], temperature=0.8, seed=seed,
                                                    **tree))
        assert len(res.token_ids) == n and res.metrics.stop_reason == "length"


def test_no_verify_rows_are_spent_past_the_answer(runner):
    """The last steps draft no deeper than the tokens still to emit."""
    prompt = PROMPTS[1]
    res = runner.generate(prompt, DecodeConfig(max_new_tokens=12, eos_token_ids=[], tree="chain", draft_length=6,
                                                fallback_after=0))
    emitted = 1  # the prefill's token
    for step in res.metrics.steps:
        assert step.tree_depth <= 12 - emitted, (emitted, step)
        emitted += step.accepted + 1


def test_a_request_longer_than_the_context_is_refused(runner):
    with pytest.raises(InputError, match="context of 48 positions"):
        runner.generate(PROMPTS[0], DecodeConfig(max_new_tokens=P - len(PROMPTS[0]) + 1))
    with pytest.raises(InputError, match="context of 48 positions"):
        runner.generate(PROMPTS[0], DecodeConfig(max_new_tokens=P, mode="ar"))
