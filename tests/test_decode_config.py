"""One decode configuration (config/decode.py) and one request object (runtime/request.py)."""

from __future__ import annotations

import pytest

from eagle_trt.config.decode import DecodeConfig, TreeSettings, tree_room
from eagle_trt.config.schema import EagleConfig
from eagle_trt.engine.manifest import TreeLimits
from eagle_trt.errors import InputError
from eagle_trt.runtime.request import Request


def test_every_tree_setting_is_declared_once_and_shared():
    # Neither the engine config nor the request config declares a decode setting of its own again.
    tree_names = set(TreeSettings.model_fields)
    assert not tree_names & set(vars(EagleConfig).get("__annotations__", {}))
    assert not tree_names & set(vars(DecodeConfig).get("__annotations__", {}))
    assert not set(vars(EagleConfig).get("__annotations__", {})) & set(vars(DecodeConfig).get("__annotations__", {}))
    assert tree_names <= set(EagleConfig.model_fields) and tree_names <= set(DecodeConfig.model_fields)
    assert set(TreeLimits.model_fields) <= tree_names  # what a manifest records is a subset of them


def test_layers_apply_in_order_and_none_means_not_given():
    engine = EagleConfig(total_tokens=16, beam_width=4, draft_length=4, lookup_tokens=0)
    cfg = DecodeConfig.layered(engine, {"total_tokens": 20, "beam_width": 2}, {"beam_width": 3, "draft_length": None})
    assert (cfg.total_tokens, cfg.beam_width, cfg.draft_length, cfg.lookup_tokens) == (20, 3, 4, 0)


@pytest.mark.parametrize("request_, message", [
    ({"top_p": 0.0}, "--top-p must be in (0, 1], got 0.0"),
    ({"temperature": float("nan")}, "--temperature must be 0 (greedy) or a finite value >= 1e-05, got nan"),
    ({"seed": -1}, "--seed must be in [0, 2**64 - 1], got -1"),
    ({"mode": "fast"}, "--mode must be 'eagle' or 'ar', got 'fast'"),
    ({"lookup_branches": 0}, "--lookup-branches must be in [1, 8], got 0"),
    ({"max_new_tokens": 0}, "--max-new-tokens must be >= 1, got 0"),
])
def test_a_bad_request_setting_is_one_line_naming_the_flag(request_, message):
    with pytest.raises(InputError) as e:
        DecodeConfig.check_request(request_)
    assert str(e.value) == message
    with pytest.raises(InputError):
        DecodeConfig.layered(TreeSettings(), {}, request_)


def test_settings_that_clash_are_checked_with_the_engine_s():
    DecodeConfig.check_request({"total_tokens": 3})  # alone it is fine: the engine's draft_length may be lower
    with pytest.raises(InputError, match=r"--total-tokens \(3\) must be >= --draft-length \(6\)"):
        DecodeConfig.layered(TreeSettings(), {}, {"total_tokens": 3})
    assert DecodeConfig.layered(TreeSettings(draft_length=2), {}, {"total_tokens": 3}).total_tokens == 3


def test_the_engine_s_tree_room_holds_its_own_trees():
    for settings in (TreeSettings(), TreeSettings(total_tokens=512, beam_width=64, draft_length=32),
                     TreeSettings(lookup_tokens=32, lookup_branches=8, datastore_branches=8)):
        assert tree_room(settings) >= DecodeConfig.layered(settings, {}, {}).tree_capacity()


def test_requests_are_independent_of_each_other():
    cfg = DecodeConfig(max_new_tokens=3, temperature=0.5, seed=7)
    a = Request.new([1, 2, 3], cfg, default_eos=[9], drafting=True)
    b = Request.new([4, 5], cfg.model_copy(update={"temperature": 0.0}), default_eos=[9], drafting=True)
    assert a.commit([7, 8]) == 2 and not a.done and b.output == [] and b.greedy and not a.greedy
    assert a.commit([6, 6, 6]) == 1 and a.done and a.metrics.stop_reason == "length"
    assert a.metrics.discarded_tokens == 2 and a.index.tokens == [1, 2, 3, 7, 8, 6]
    assert b.commit([9, 1]) == 1 and b.metrics.stop_reason == "eos" and b.index.tokens == [4, 5, 9]
    assert a.generator is not None and b.generator is None and a.generator is not b.generator


def test_a_runner_keeps_nothing_of_a_request(tiny_runner_pair):
    runner, prompt = tiny_runner_pair
    before = dict(vars(runner))
    first = runner.generate(prompt, DecodeConfig(max_new_tokens=12, eos_token_ids=[])).token_ids
    assert set(vars(runner)) == set(before)
    assert all(before[k] is v for k, v in vars(runner).items())
    runner.generate(prompt[:3], DecodeConfig(max_new_tokens=5, temperature=0.8, seed=1, eos_token_ids=[]))
    assert runner.generate(prompt, DecodeConfig(max_new_tokens=12, eos_token_ids=[])).token_ids == first


@pytest.fixture(scope="module")
def tiny_runner_pair(tiny_model_dir, tiny_head_dir):
    from eagle_trt.models.draft_head import Eagle3DraftHead
    from eagle_trt.models.llama import LlamaTarget
    from eagle_trt.runtime.runner import Runner

    target = LlamaTarget.load(tiny_model_dir)
    return Runner(target, Eagle3DraftHead.load(tiny_head_dir, target), capacity=512), [5, 6, 7, 8, 9, 10]


def test_a_manifest_written_before_the_rename_still_reads():
    old = dict(draft_length=4, max_beam_width=3, total_tokens=12, tree="dynamic", confidence_threshold=0.0,
               static_tree=None)
    assert TreeLimits.model_validate(old).beam_width == 3
    assert "beam_width" in TreeLimits.model_validate(old).model_dump()
