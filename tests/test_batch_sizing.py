"""The batch-aware sizing (speculative/batch_sizing.py) on synthetic cost curves: no model, no timing."""

import pytest

from eagle_trt.speculative.batch_sizing import CostCurve, Ema, ModeChooser, tree_sizes, width_class


def test_cost_curve_interpolates_and_extends():
    c = CostCurve({1: 10.0, 9: 14.0, 17: 30.0})
    assert c(1) == 10.0 and c(5) == 12.0 and c(13) == 22.0
    assert c(25) == 46.0  # past the end: the last segment's slope
    assert c(0) == 10.0
    assert CostCurve({4: 8.0})(8) == 16.0
    with pytest.raises(ValueError):
        CostCurve({})


def test_free_rows_verify_every_node_and_dear_rows_none():
    probs = [[0.9, 0.5, 0.1], [0.8, 0.2]]
    assert tree_sizes(probs, fixed_rows=2, cost=CostCurve({1: 10.0, 100: 10.0}), rate=0.2) == [3, 2]
    assert tree_sizes(probs, fixed_rows=2, cost=CostCurve({1: 10.0, 2: 20.0}), rate=0.2) == [0, 0]


def test_the_cut_takes_nodes_in_one_order_of_probability_across_requests():
    # 1 ms a row at 0.4 tokens per ms: a node pays while its p is above 0.4.
    cost = CostCurve({2: 10.0, 12: 20.0})
    assert tree_sizes([[0.9, 0.3, 0.05], [0.95, 0.6, 0.02]], 2, cost, rate=0.4) == [1, 2]
    # A slower batch (0.1 tokens per ms) buys every node above 0.1.
    assert tree_sizes([[0.9, 0.3, 0.05], [0.95, 0.6, 0.02]], 2, cost, rate=0.1) == [2, 2]


def test_a_jump_in_the_curve_is_weighed_against_the_nodes_after_it():
    # The 3rd row costs 5 ms (a new pass over the weights), the rows after it nothing: worth it for 6 good nodes.
    cost = CostCurve({1: 10.0, 3: 10.0, 4: 15.0, 64: 15.0})
    assert tree_sizes([[0.9, 0.9, 0.8, 0.8, 0.8, 0.8]], 1, cost, rate=0.5) == [6]
    assert tree_sizes([[0.9, 0.9, 0.1]], 1, cost, rate=0.5) == [2]


def test_the_mode_chooser_measures_both_and_keeps_the_faster():
    m, seg = ModeChooser(), ModeChooser.SEGMENT
    assert m.choose(4) == "draft" and m.exploring(4)  # a new width: a try of drafting first,
    m.record(4, "draft", tokens=60, ms=300.0, steps=6)
    assert m.choose(4) == "plain" and m.exploring(4)  # then of plain,
    m.record(4, "plain", tokens=64, ms=200.0, steps=6)

    def run(n_segments, draft_wins=False):
        modes = []
        for _ in range(n_segments):
            mode = m.choose(4)
            modes.append(mode)
            if mode == "plain":
                m.record(4, "plain", 64, 200.0, seg)
            else:
                m.record(4, "draft", 300 if draft_wins else 60, 100.0 if draft_wins else 300.0, ModeChooser.TRY)
        return modes

    # The faster for 2 segments' worth of steps, then a try of the other; it loses, so the next wait is 4.
    assert run(8) == ["plain", "plain", "draft", "plain", "plain", "plain", "plain", "draft"]
    # Two lost tries: the next comes after 8 segments; drafting wins it and takes the lead.
    assert run(9, draft_wins=True) == ["plain"] * 8 + ["draft"] and m._leader(4) == "draft"
    # A width not measured yet: the nearest measured one's leader first, then the other is measured there too.
    assert m.choose(1) == m._leader(4) and m.exploring(1)
    m.record(1, m._leader(4), 10, 100.0, 6)
    assert m.choose(1) != m._leader(4)
    assert m.best_rate(4) == max(m.rate(4, "draft"), m.rate(4, "plain")) == m.best_rate(9)


def test_ema():
    e = Ema(alpha=0.5)
    assert e.get(7.0) == 7.0
    e.add(2.0)
    e.add(4.0)
    assert e.get(7.0) == 3.0


def test_width_classes():
    assert [width_class(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 16, 17)] == [0, 1, 2, 4, 4, 8, 8, 16, 16, 32]
