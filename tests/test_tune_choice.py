"""`eagle-trt tune`, the pure choice: candidate settings, lookup grid, the ranking on synthetic curves (row
spreads, caps, a fixed step cost), the decode-path walk and the finalists. No model."""

import pytest
import torch

from eagle_trt.bench.stats import interpolate
from eagle_trt.bench.tune_choice import (
    LOOKUP_OFF,
    Setting,
    candidate_count,
    candidate_settings,
    choose,
    lookup_grid,
    predict_tps,
)


def test_candidate_settings_respect_depth_room_and_tree_size():
    s = candidate_settings([1, 4], max_depth=3, room=20)
    assert Setting(1, 2, 2) in s and Setting(1, 2, 3) not in s  # a chain has only d nodes
    assert all(x.draft_length <= x.total_tokens <= min(candidate_count(x.beam_width, x.draft_length), 20) for x in s)
    assert Setting(4, 3, 20) in s and not any(x.total_tokens > 20 for x in s)
    assert Setting(8, 6, 32) in candidate_settings([1], 2, 64, include=[Setting(8, 6, 32)])
    assert candidate_count(8, 6) == 8 + 5 * 64


def test_choose_flat_verify_curve_prefers_a_big_tree():
    # Verifying up to 32 tokens costs the same as one (memory-bound), drafting is cheap: take the big tree.
    verify = {1: 10.0, 33: 10.0, 65: 20.0}
    draft = {(1, 1): 0.5, (4, 4): 2.0}
    extend = {1: 0.2, 5: 0.4}
    taus = {Setting(1, 1, 1): 1.6, Setting(4, 4, 8): 2.5, Setting(4, 4, 32): 3.0, Setting(4, 4, 64): 3.1}
    ranked = choose(taus, verify, draft, extend)
    assert (ranked[0]["beam_width"], ranked[0]["draft_length"], ranked[0]["total_tokens"]) == (4, 4, 32)
    assert ranked[0]["predicted_tokens_per_second"] == pytest.approx(
        predict_tps(3.0, 2.0, 0.2 + 0.2 * 2.0 / 4, 10.0))
    # The 64-token tree gains little tau but pays nearly double verify.
    assert ranked[-1]["total_tokens"] in (64, 1) and len(ranked) == 4


def test_choose_steep_verify_curve_or_no_acceptance_prefers_a_small_tree():
    verify = {1: 10.0, 2: 20.0, 9: 90.0, 33: 330.0}  # compute-bound: cost grows with every token
    draft = {(1, 1): 0.5, (4, 4): 2.0, (1, 4): 2.0}
    extend = {1: 0.1}
    taus = {Setting(1, 1, 1): 1.5, Setting(4, 4, 8): 2.5, Setting(4, 4, 32): 3.0, Setting(1, 4, 4): 2.0}
    assert choose(taus, verify, draft, extend)[0]["total_tokens"] == 1
    # An untrained head (tau = 1 everywhere): the cheapest step wins even on a flat curve.
    flat = {1: 10.0, 33: 10.0}
    ones = {s: 1.0 for s in taus}
    best = choose(ones, flat, draft, extend)[0]
    assert (best["beam_width"], best["draft_length"], best["total_tokens"]) == (1, 1, 1)


def test_choose_ties_go_to_the_smaller_tree():
    ranked = choose({Setting(2, 2, 4): 2.0, Setting(2, 2, 3): 2.0}, {1: 5.0, 10: 5.0}, {(2, 2): 1.0}, {1: 0.0})
    assert ranked[0]["total_tokens"] == 3


def test_lookup_grid_keeps_off_and_what_fits_the_room():
    grid = lookup_grid([0, 4, 8], [1, 2], [0, 1], room=16, include=[(12, 1, 0)])
    assert grid[0] == LOOKUP_OFF and (12, 1, 0) in grid
    assert (8, 2, 0) in grid and (8, 2, 1) not in grid  # 8 x 3 copies > 16 rows
    assert all(t * (b + ds) <= 16 for t, b, ds in grid if t and t != 12) and not any(t == 0 for t, _, _ in grid[1:])
    assert lookup_grid([0], [1, 2], [0, 1], room=64) == [LOOKUP_OFF]


def test_choose_charges_lookup_copies_their_verify_rows():
    """Copies that lift tau win on a flat verify curve and lose where every row costs (compute-bound)."""
    draft, extend = {(2, 1): 1.0}, {1: 0.1, 4: 0.2}
    head, copies = Setting(2, 1, 2), Setting(2, 1, 2, 8, 2, 0)
    taus = {head: 1.5, copies: 2.0}
    rows, ms = {copies: 2 + 12.0}, {(8, 2, 0): 0.5}  # the head's 2 rows and 12 copied ones
    flat = choose(taus, {1: 10.0, 64: 10.5}, draft, extend, rows, ms)
    assert flat[0]["lookup_tokens"] == 8 and flat[0]["verify_rows"] == 15.0 and flat[0]["lookup_ms"] == 0.5
    assert flat[0]["predicted_tokens_per_second"] == pytest.approx(
        predict_tps(2.0, 1.0, 0.1 + 0.1 * 1.0 / 3, 10.0 + 0.5 * 14 / 63, 0.5))
    steep = choose(taus, {1: 10.0, 2: 20.0, 64: 640.0}, draft, extend, rows, ms)
    assert steep[0]["lookup_tokens"] == 0 and steep[0]["verify_rows"] == 3  # the head's tree alone, root included


def test_choose_charges_each_step_at_its_own_verify_size():
    """On a curve with a step (bf16: a second pass over the weights past 32 rows) the cost is the mean over the
    steps' sizes, not the cost at their mean size: copies that sometimes cross the step lose to capped ones."""
    from eagle_trt.bench.tune_choice import row_caps

    draft, extend = {(2, 1): 1.0}, {1: 0.0, 8: 0.0}
    cliff = {1: 10.0, 32: 10.0, 33: 20.0, 64: 20.0}
    free, capped = Setting(2, 1, 2, 8, 4, 0), Setting(2, 1, 2, 8, 4, 0, 32)
    assert capped.copy_budget == 29 and row_caps(free.tree, free.lookup, [3, 4, 32, 35]) == [0, 4, 32]
    taus = {free: 3.0, capped: 2.9}
    # Rows besides the root: the head's 2 and the copies' 4 or 32 (29 under the cap).
    spread = {free: {6: 0.75, 34: 0.25}, capped: {6: 0.75, 31: 0.25}}
    ranked = choose(taus, cliff, draft, extend, spread)
    assert ranked[0]["max_verify_rows"] == 32
    by = {r["max_verify_rows"]: r for r in ranked}
    assert by[0]["verify_ms"] == pytest.approx(0.75 * 10 + 0.25 * 20) and by[0]["verify_rows"] == pytest.approx(14)
    assert by[32]["verify_ms"] == pytest.approx(10.0)
    # Charged at the mean size (14 rows) instead, the uncapped copies would have looked better.
    assert choose(taus, cliff, draft, extend, {free: 13.0, capped: 12.25})[0]["max_verify_rows"] == 0


def test_a_confidence_threshold_is_charged_the_rows_it_keeps():
    """Where each verify row costs (compute-bound), a threshold that verifies the head's tree only where it is
    sure wins over the whole tree even at a lower tau; where rows are free the whole tree's tau wins."""
    draft, extend = {(2, 2): 1.0}, {1: 0.0, 3: 0.0}
    whole, sure = Setting(2, 2, 2), Setting(2, 2, 2, confidence_threshold=0.3)
    assert sure.tree == sure and sure.plus((8, 1, 0), 16).confidence_threshold == 0.3
    taus = {whole: 1.6, sure: 1.5}
    rows = {sure: {0: 0.5, 1: 0.25, 2: 0.25}}  # half the steps verify the root alone; `whole` always 2 rows
    steep = {1: 20.0, 2: 26.0, 3: 32.0}
    ranked = choose(taus, steep, draft, extend, rows)
    assert ranked[0]["confidence_threshold"] == 0.3
    assert ranked[0]["verify_ms"] == pytest.approx(0.5 * 20 + 0.25 * 26 + 0.25 * 32)
    assert ranked[0]["verify_rows"] == pytest.approx(1.75) and ranked[1]["verify_rows"] == 3
    flat = {1: 20.0, 3: 20.0}
    assert choose(taus, flat, draft, extend, rows)[0]["confidence_threshold"] == 0.0


def test_thresholds_cross_every_tree_and_skip_row_caps():
    from eagle_trt.bench.tune_choice import row_caps, run_name

    s = candidate_settings([1, 2], max_depth=2, room=8, thresholds=(0.0, 0.25))
    plain = {x for x in s if x.confidence_threshold == 0.0}
    assert {Setting(x.beam_width, x.draft_length, x.total_tokens, confidence_threshold=0.25) for x in plain} == \
        set(s) - plain
    sure = Setting(2, 1, 2, confidence_threshold=0.25)
    assert row_caps(sure, (8, 2, 0), [4, 6]) == [0] and row_caps(sure.tree.plus(LOOKUP_OFF), (8, 2, 0), [6]) == [0]
    assert row_caps(Setting(2, 1, 2), (8, 2, 0), [4, 6]) == [0, 4, 6]
    assert run_name(sure, 2) == "2x1x2/p0.25/fallback2" and run_name(Setting(2, 1, 2), 0) == "2x1x2/fallback0"


def test_a_fixed_step_cost_favours_settings_that_commit_more_per_step():
    """The measured per-step overhead enters every prediction; a large one tips the ranking to the higher tau."""
    draft, extend, verify = {(2, 1): 1.0, (4, 3): 3.0}, {1: 0.0, 8: 0.0}, {1: 10.0, 16: 20.0}
    small, big = Setting(2, 1, 2), Setting(4, 3, 12)
    taus = {small: 1.6, big: 2.6}
    assert choose(taus, verify, draft, extend)[0]["total_tokens"] == 2  # 1.6 per 12.3 ms beats 2.6 per 21 ms
    ranked = choose(taus, verify, draft, extend, step_ms=20.0)
    assert ranked[0]["total_tokens"] == 12 and ranked[0]["step_ms"] == 20.0
    assert ranked[0]["predicted_tokens_per_second"] == pytest.approx(
        predict_tps(2.6, 3.0, 0.0, interpolate({1: 10.0, 16: 20.0}, 13), 0.0, 20.0))


def test_walk_follows_the_runtime_path_not_every_position():
    from eagle_trt.bench.tune_choice import walk

    # Setting 0 accepts 3 wherever 3 tokens are left; setting 1 accepts 7 at the first position, nothing elsewhere.
    accepted = torch.tensor([[3, 7], [3, 0], [3, 0], [3, 0], [3, 0], [3, 0], [3, 0], [3, 0], [2, 0], [1, 0]])
    rows = torch.full((10, 2), 2.0)
    rows[0, 1] = 5.0  # setting 1's first step adds 5 rows
    tokens, steps, spread = walk(accepted, rows)
    # Setting 0: roots 0, 4, 8 (4 + 4 + the 2 tokens left). Setting 1: root 0 (8 tokens), root 8, root 9.
    assert tokens.tolist() == [10, 10] and steps.tolist() == [3, 3]
    # Steps by rows added: setting 0 three steps of 2 rows, setting 1 one of 5 and two of 2.
    assert spread.tolist() == [[0, 0, 3, 0, 0, 0], [0, 0, 2, 0, 0, 1]]
    # Every path commits exactly the output; averaged over every position, setting 1 would look like
    # 1 + 0.7 = 1.7 tokens a step, its path gives 3.33.
    assert tokens[1] / steps[1] == pytest.approx(10 / 3)


def test_finalists_are_the_best_predicted_plus_the_default():
    from eagle_trt.bench.tune_choice import finalists

    ranked = [{"beam_width": b, "draft_length": d, "total_tokens": n} for b, d, n in ((4, 2, 8), (8, 3, 16), (2, 2, 4))]
    default = {"beam_width": 8, "draft_length": 3, "total_tokens": 16}
    assert finalists(ranked, default, 2) == [Setting(4, 2, 8), Setting(8, 3, 16)]  # default already in
    assert finalists(ranked, {"beam_width": 8, "draft_length": 6, "total_tokens": 32}, 1) == [
        Setting(4, 2, 8), Setting(8, 6, 32)]
    assert finalists(ranked, None, 0) == []
    # The best setting without lookup joins before the default; a lookup setting is its own finalist.
    lk = {"beam_width": 4, "draft_length": 2, "total_tokens": 8, "lookup_tokens": 8, "lookup_branches": 2,
          "datastore_branches": 1}
    assert finalists([lk, *ranked], default, 1, extra=[ranked[0]]) == [Setting(4, 2, 8, 8, 2, 1), Setting(4, 2, 8),
                                                                       Setting(8, 3, 16)]
