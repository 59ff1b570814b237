"""The step budget (speculative/step_budget.py) on synthetic curves and histories: no model, no timing."""

from __future__ import annotations

import math

import pytest

from eagle_trt.speculative.step_budget import (CostCurve, DepthCalibration, DraftHistory, DraftOutlook, Ema,
                                               MARGIN, OnlineCost, Probe, StepShape, choose_drafters, cut_trees,
                                               expected_by_depth, node_values, non_decreasing)

FLAT = CostCurve({1: 10.0, 200: 10.0})  # rows cost nothing
STEEP = CostCurve({1: 10.0, 2: 20.0})  # every row costs a whole forward


def test_the_cost_curve_interpolates_and_extends():
    c = CostCurve({1: 10.0, 9: 14.0, 17: 30.0})
    assert c(1) == 10.0 and c(5) == 12.0 and c(13) == 22.0 and c(25) == 46.0 and c(0) == 10.0
    assert CostCurve({4: 8.0})(8) == 16.0
    with pytest.raises(ValueError):
        CostCurve({})


def test_the_online_cost_needs_two_row_counts_and_never_falls():
    c = OnlineCost(alpha=1.0)
    c.add(1, 10.0)
    assert not c.ready
    c.add(9, 14.0)
    assert c.ready and c(1) == pytest.approx(10.0) and c(5) == pytest.approx(12.0) and c(17) == pytest.approx(18.0)
    c.add(17, 30.0)  # through the averages; past the last, the mean slope from the first (20 ms over 16 rows)
    assert c(9) == pytest.approx(14.0) and c(13) == pytest.approx(22.0) and c(33) == pytest.approx(50.0)
    falling = OnlineCost(alpha=1.0)
    falling.add(1, 10.0)
    falling.add(8, 6.0)  # noise: more rows timed faster; pooled
    assert falling(1) == falling(8) == falling(64) == pytest.approx(8.0)
    assert non_decreasing([1.0, 3.0, 2.0, 5.0, 4.0, 4.0]) == pytest.approx([1.0, 2.5, 2.5, 13 / 3, 13 / 3, 13 / 3])


def test_calibration_measures_each_depth_and_shrinks_to_its_parent():
    server = DepthCalibration()
    assert server.factor(1) == 1.0 and server.factor(7) == 1.0
    for _ in range(50):  # the drafter says 0.8 at depth 1, the target agrees half the time
        server.observe([0.8, 0.4], reached=1)
        server.observe([0.8, 0.4], reached=0)
    assert server.factor(1) == pytest.approx((50 + 2) / (80 + 2))
    assert server.factor(2) == pytest.approx(2 / (40 + 2))  # never reached depth 2
    request = DepthCalibration(parent=server, prior=4.0)
    assert request.factor(1) == server.factor(1)  # nothing seen: the server's
    request.observe([0.5], reached=1)
    assert request.factor(1) == pytest.approx((1 + 4 * server.factor(1)) / (0.5 + 4))
    assert expected_by_depth([0.5, 0.25, 0.25, 0.1], [1, 1, 2, 3]) == [0.75, 0.25, 0.1]


def test_node_values_never_exceed_their_parent_or_one():
    cal = DepthCalibration(prior=1.0)
    cal.observe([0.2, 0.1], reached=2)  # depth 1 came true 5x more often than said, depth 2 10x
    values = node_values([0.2, 0.1, 0.05], parents=[0, 1, 1], depths=[1, 2, 2], calibration=cal)
    f1, f2 = cal.factor(1), cal.factor(2)
    assert values[0] == pytest.approx(min(0.2 * f1, 1.0))
    assert values[1] == pytest.approx(min(0.1 * f2, values[0]))  # capped at its parent
    assert values[2] == pytest.approx(min(0.05 * f2, values[0]))
    assert all(v <= 1.0 for v in values)


def test_cheap_rows_keep_every_node_and_dear_rows_none():
    values = [[0.9, 0.5, 0.1], [0.8, 0.3]]
    shape = StepShape(tokens=2, rows=2)
    assert cut_trees(values, shape, FLAT) == [3, 2]
    assert cut_trees(values, shape, STEEP) == [0, 0]
    assert cut_trees([], shape, FLAT) == []  # the empty budget
    assert cut_trees([[], []], shape, FLAT) == [0, 0]


def test_the_cut_is_the_best_ratio_across_the_batch():
    # Rows past 4 cost a forward's worth each: the best prefix takes the batch's best nodes first.
    cost = CostCurve({1: 10.0, 4: 10.0, 5: 20.0})
    shape = StepShape(tokens=2, rows=2)
    assert cut_trees([[0.9, 0.3], [0.95, 0.6]], shape, cost) == [1, 1]
    # Ties go to the earlier request.
    assert cut_trees([[0.5], [0.5]], StepShape(tokens=2, rows=2), CostCurve({1: 10.0, 3: 10.0, 4: 40.0})) == [1, 0]


def test_time_already_spent_makes_marginal_nodes_worth_more():
    cost = CostCurve({1: 10.0, 2: 12.0, 3: 14.0})  # each row costs 2 ms
    values = [[0.9, 0.15]]
    assert cut_trees(values, StepShape(tokens=1, rows=1), cost) == [1]  # 1.9/12 > 2.05/14
    assert cut_trees(values, StepShape(tokens=1, rows=1, sunk_ms=20.0), cost) == [2]  # 1.9/32 < 2.05/34


def test_drafting_must_pay_for_its_time_and_rows():
    shape = StepShape(tokens=1, rows=1)
    cost = CostCurve({1: 10.0, 9: 12.0})  # a quarter ms a row
    worth = DraftOutlook(values=[0.9, 0.7, 0.5, 0.05], extra=0.0, ms=3.0)
    # Alone its best cut is the first three nodes: 3.1 tokens / 13.75 ms beats plain's 1 / 10 ms (the fourth node
    # adds 0.05 tokens for 0.25 ms, below the rate).
    assert worth.best(shape, cost) == (pytest.approx(2.1), 3)
    not_worth = DraftOutlook(values=[0.2, 0.1], extra=0.05, ms=3.0)  # at best 1.25 tokens / 13.25 ms: loses
    assert drafts([worth], shape, cost) == [True]
    assert drafts([not_worth], shape, cost) == [False]
    assert choose_drafters([worth], shape, cost)[0] == pytest.approx((3.1 / 13.75) / (1 / 10))  # its gain
    assert choose_drafters([None], shape, cost) == [math.inf]  # nothing measured yet: it drafts and measures
    assert choose_drafters([], shape, cost) == []
    # Two requests: the better one is admitted first; the second only while the step's rate still rises.
    two = StepShape(tokens=2, rows=2)
    assert drafts([not_worth, worth], two, cost) == [False, True]
    assert drafts([worth, worth], two, FLAT) == [True, True]
    assert drafts([worth, worth], two, STEEP) == [False, False]
    # Copies' rows count too: half a token from four copied rows pays where rows are free, not where they are dear.
    copies = DraftOutlook(values=[], extra=0.5, ms=0.5, extra_rows=4)
    assert copies.best(shape, FLAT) == (0.5, 4)
    assert drafts([copies], shape, FLAT) == [True] and drafts([copies], shape, STEEP) == [False]
    # A gain must exceed 1 + MARGIN: a tree worth nothing adds its drafting time and no token.
    worthless = DraftOutlook(values=[0.0], extra=0.0, ms=0.5)
    assert choose_drafters([worthless], shape, FLAT)[0] < 1 + MARGIN and drafts([worthless], shape, FLAT) == [False]


def drafts(outlooks, shape, cost) -> list[bool]:
    return [g > 1 + MARGIN for g in choose_drafters(outlooks, shape, cost)]


def test_a_plain_request_probes_at_doubling_gaps():
    p = Probe()
    verdicts = [p.drafts(0.5) for _ in range(4 + 8 + 16)]
    assert [i for i, v in enumerate(verdicts) if v] == [3, 11, 27]
    assert p.drafts(1.5) and p.gap == Probe.MIN_GAP
    p.gap = Probe.MAX_GAP
    p.drafts(0.5)
    assert p.gap == Probe.MAX_GAP
    never_off = Probe()
    assert sum(never_off.drafts(0.1) for _ in range(1000)) >= 1000 // Probe.MAX_GAP


def test_a_history_outlooks_its_averages_shrunk_to_the_servers():
    server, request = DraftHistory(), DraftHistory()
    assert request.outlook(server) is None and request.outlook() is None
    server.add([0.5, 0.9], 1.0, 4.0)  # any order: kept best first
    assert request.outlook(server) == DraftOutlook([0.9, 0.5], 1.0, 4.0)  # nothing of its own: the server's
    request.add([0.3], 0.0, 2.0)  # one step of its own weighs 1 / (1 + PRIOR); a rank it never had counts as 0
    w = 1 / (1 + DraftHistory.PRIOR)
    o = request.outlook(server)
    assert o.values == pytest.approx([w * 0.3 + (1 - w) * 0.9, (1 - w) * 0.5])
    assert (o.extra, o.ms) == pytest.approx(((1 - w) * 1.0, w * 2.0 + (1 - w) * 4.0))
    request.add([0.8, 0.6], 0.0, 2.0)  # a rank first seen after a step without it starts from 0
    assert request.outlook().values == pytest.approx([0.3 + DraftHistory.ALPHA * 0.5, DraftHistory.ALPHA * 0.6])
    for _ in range(200):
        request.add([0.4], 1.0, 3.0)
    assert request.outlook(server).values[0] == pytest.approx(0.4, abs=0.02)  # its own, once it has many
    e = Ema(0.5)
    e.add(2.0)
    e.add(4.0)
    assert e.get(0.0) == 3.0 and Ema().get(7.0) == 7.0
