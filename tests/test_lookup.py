"""Prompt-lookup branches: the n-gram index, grafting onto a tree, and losslessness in the runner."""

import pytest
import torch

from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.proposers import CONTEXT, DATASTORE, DRAFTER, grafted
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.runner import Runner
from eagle_trt.timing import TickClock
from eagle_trt.speculative.lookup import NgramIndex, copy_budget, graft, trie_size, within_rows
from eagle_trt.speculative.tree import tree_from_parents
from lossless_support import assert_lossless


def test_index_never_proposes_the_suffix_itself():
    index = NgramIndex()
    index.extend([1, 2, 3])
    assert index.proposals(4, 1) == []  # each n-gram occurs once: nothing earlier to copy
    index.extend([9, 1, 2])
    assert index.proposals(4, 1) == [[3, 9, 1, 2]]  # [1, 2] occurred at the start; copy what followed it


def test_index_prefers_the_longest_then_the_latest_match():
    index = NgramIndex(max_ngram=3)
    index.extend([7, 1, 2, 50, 8, 2, 60, 7, 1, 2])
    # [2] alone last occurred before 60; the 3-gram [7, 1, 2] occurred before 50 and wins.
    assert index.proposals(2, 1) == [[50, 8]]
    index.extend([70, 2])
    assert index.proposals(1, 1) == [[70]]  # no 3- or 2-gram match: the latest earlier [2] is followed by 70


def test_index_min_ngram_and_short_continuations():
    index = NgramIndex(max_ngram=2, min_ngram=2)
    index.extend([4, 5, 6, 4])
    assert index.proposals(3, 1) == []  # only a 1-gram match ([4]), below min_ngram
    index.extend([5])
    assert index.proposals(3, 1) == [[6, 4, 5]]  # the copy may run into the recent tokens
    assert index.proposals(0, 1) == []
    with pytest.raises(ValueError):
        NgramIndex(max_ngram=1, min_ngram=2)


def test_proposals_are_distinct_latest_first_then_shorter_matches():
    index = NgramIndex(max_ngram=2)
    index.extend([1, 2, 3, 9, 1, 2, 4, 8, 2, 5, 1, 2])
    assert index.proposals(2, 1) == [[4, 8]]  # the latest [1, 2]
    assert index.proposals(2, 2) == [[4, 8], [3, 9]]  # then the older one
    assert index.proposals(2, 4) == [[4, 8], [3, 9], [5, 1]]  # then the 1-gram [2]'s other continuation
    index.extend([4])
    assert index.proposals(3, 3) == [[8, 2, 5]]  # [2, 4] and [4] occurred once, with the same continuation


def test_graft_shares_prefixes_and_keeps_children_distinct():
    tokens, parents = [10, 11, 12, 13], [-1, 0, 0, 1]
    new_tokens, new_parents, added = graft(tokens, parents, [11, 13, 14, 15])
    assert added == 2  # 11 -> 13 already exist; 14 and 15 hang below node 3
    assert new_tokens == [10, 11, 12, 13, 14, 15] and new_parents == [-1, 0, 0, 1, 3, 4]
    assert graft(tokens, parents, [12]) == (tokens, parents, 0)
    _, par, added = graft(tokens, parents, [20, 21])
    assert added == 2 and par[-2:] == [0, 4]
    for i in range(1, len(new_parents)):
        kids = [new_tokens[j] for j in range(1, len(new_parents)) if new_parents[j] == new_parents[i]]
        assert len(kids) == len(set(kids))


def test_grafting_copies_builds_a_valid_tree_with_a_span_per_source():
    tree = tree_from_parents(torch.tensor([10, 11, 12]), torch.tensor([-1, 0, 0]))
    for chains in ([], [[11]]):  # nothing new: the same tree object, not a rebuilt one
        same = grafted(tree, chains)
        assert same.tree() is tree and same.span(CONTEXT).size == 0 and same.span(DRAFTER).stop == 3
    grown = grafted(tree, [[11, 30, 31]]).tree()
    assert grown.tokens.tolist() == [10, 11, 12, 30, 31] and grown.depths.tolist() == [0, 1, 1, 2, 3]
    assert grown.mask[4].tolist() == [True, True, False, True, True]  # node 31 sees root, 11, 30, itself
    # The datastore's copies come after the context's: each source owns one span of node indices.
    both = grafted(tree, [[11, 30]], [[11, 30, 40], [50]])
    assert both.tree().tokens.tolist() == [10, 11, 12, 30, 40, 50] and both.parents[4:] == [3, 0]
    assert (both.span(CONTEXT).start, both.span(CONTEXT).stop, both.span(DATASTORE).stop) == (3, 4, 6)
    path = [0, 1, 3, 4]  # root -> 11 (drafted) -> 30 (context) -> 40 (datastore)
    assert [both.accepted_from(path, s) for s in (DRAFTER, CONTEXT, DATASTORE)] == [1, 1, 1]


def test_within_rows_cuts_copies_to_the_budget_in_priority_order():
    chains, more = [[1, 2, 3, 4], [1, 2, 9]], [[7, 8]]
    assert within_rows(chains, more, None) == (chains, more)
    assert within_rows(chains, more, 100) == (chains, more)
    # 4 rows: the first chain whole; the second shares [1, 2] and needs one more row (9): none left.
    assert within_rows(chains, more, 4) == ([[1, 2, 3, 4], [1, 2]], [])
    assert within_rows(chains, more, 5) == ([[1, 2, 3, 4], [1, 2, 9]], [])
    assert within_rows(chains, more, 6) == ([[1, 2, 3, 4], [1, 2, 9]], [[7]])
    assert within_rows(chains, more, 2) == ([[1, 2], [1, 2]], [])
    assert within_rows(chains, more, 0) == ([], [])
    for budget in range(9):
        cut, extra = within_rows(chains, more, budget)
        assert trie_size(cut + extra) == min(budget, trie_size(chains + more))
    # The budget the runtime and tune both derive from a cap: what the head's tree (root included) leaves.
    assert copy_budget(0, 5) is None and copy_budget(16, 5) == 11 and copy_budget(4, 5) == 0


@pytest.fixture(scope="module")
def runner(tiny_model_dir, tiny_head_dir):
    """Its clock pinned (eagle_trt/timing.py): the copy gate's row price and token worth are counts of clock
    readings, so which copies a step verifies does not depend on the machine's load."""
    target = LlamaTarget.load(tiny_model_dir)
    return Runner(target, Eagle3DraftHead.load(tiny_head_dir, target), capacity=512, clock=TickClock())


@pytest.mark.parametrize("tree", [dict(tree="dynamic", beam_width=3, draft_length=3, total_tokens=6),
                                  dict(tree="dynamic", beam_width=2, draft_length=2, total_tokens=3, lookup_branches=3),
                                  dict(tree="chain", draft_length=2), dict(tree="static")],
                         ids=["dynamic", "dynamic-3-branches", "chain", "static"])
@pytest.mark.parametrize("prompt", [[5, 6, 7, 8, 9] * 3, [100, 20, 30, 40]])
def test_greedy_with_lookup_equals_ar_and_uses_the_copies(runner, prompt, tree):
    ar = runner.generate(prompt, DecodeConfig(max_new_tokens=60, mode="ar", eos_token_ids=[])).token_ids
    res = runner.generate(prompt, DecodeConfig(max_new_tokens=60, eos_token_ids=[], lookup_tokens=6, **tree))
    assert_lossless(runner, prompt, res.token_ids, ar)
    m = res.metrics.to_dict()
    assert m["lookup_tokens_verified"] > 0
    # A random tiny model falls into loops, which the lookup branch predicts; the untrained head does not.
    assert m["lookup_tokens_accepted"] > 0
    off = runner.generate(prompt, DecodeConfig(max_new_tokens=60, eos_token_ids=[], **{**tree, "lookup_tokens": 0}))
    assert off.metrics.to_dict()["lookup_tokens_verified"] == 0
    assert res.metrics.acceptance_length > off.metrics.acceptance_length


@pytest.mark.parametrize("cap", [8, 12])
def test_max_verify_rows_caps_the_copies_and_stays_lossless(runner, cap):
    prompt = [5, 6, 7, 8, 9] * 3
    tree = dict(tree="dynamic", beam_width=2, draft_length=2, total_tokens=4, lookup_tokens=6, lookup_branches=3,
                max_new_tokens=60, eos_token_ids=[])
    ar = runner.generate(prompt, DecodeConfig(mode="ar", max_new_tokens=60, eos_token_ids=[])).token_ids
    free = runner.generate(prompt, DecodeConfig(**tree))
    capped = runner.generate(prompt, DecodeConfig(max_verify_rows=cap, **tree))
    assert_lossless(runner, prompt, free.token_ids, ar)
    assert_lossless(runner, prompt, capped.token_ids, ar)
    assert max(st.tree_size + 1 for st in free.metrics.steps) > cap  # the cap binds somewhere
    assert all(st.tree_size + 1 <= cap for st in capped.metrics.steps)
    assert capped.metrics.to_dict()["lookup_tokens_accepted"] > 0
    # A head tree alone over the cap gets no copies at all (the tree itself is never cut).
    none = runner.generate(prompt, DecodeConfig(max_verify_rows=3, **tree))
    assert_lossless(runner, prompt, none.token_ids, ar)
    assert none.metrics.to_dict()["lookup_tokens_verified"] == 0


def test_lookup_needs_room_in_the_cache(runner):
    from eagle_trt.errors import InputError

    runner.generate([5] * 400, DecodeConfig(max_new_tokens=60, lookup_tokens=0))  # fits without the branches
    with pytest.raises(InputError, match="exceed the KV cache"):
        runner.generate([5] * 400, DecodeConfig(max_new_tokens=60, lookup_tokens=8, lookup_branches=8))


def test_prompt_lookup_is_reported_as_torch_only():
    from eagle_trt.config.schema import EagleConfig
    from eagle_trt.engine.trtllm_bundle import check_trtllm_config

    def warnings(lookup_tokens):
        cfg = EagleConfig(backend="trtllm", dtype="bfloat16", draft_length=4, total_tokens=16, beam_width=4,
                          lookup_tokens=lookup_tokens)
        return check_trtllm_config(cfg)

    assert any("prompt-lookup" in w for w in warnings(8))
    assert not any("prompt-lookup" in w for w in warnings(0))
