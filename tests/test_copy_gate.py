"""Adaptive prompt lookup (speculative/copy_gate.py): what a copy earns is learned from the emitted text whether it
was grafted or not, copies are cut where they stop paying, and greedy output stays the target's."""

import pytest

from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.runner import Runner
from eagle_trt.speculative.copy_gate import PRIOR_HITS, PRIOR_MISSES, CopyGate, RowPrice
from eagle_trt.timing import TickClock

PRIOR = PRIOR_HITS / (PRIOR_HITS + PRIOR_MISSES)


def test_a_copy_is_scored_against_the_text_that_follows_it_grafted_or_not():
    gate = CopyGate()
    history = [1, 2, 3]
    assert gate.cut([[7, 8, 9, 10]], source=0, start=3) == [[7, 8, 9, 10]]  # no prices yet: whole
    gate.stepped(head_accepted=1, history=history + [7, 8])  # the text does not cover the chain yet
    assert gate.seen == {}
    gate.stepped(head_accepted=0, history=history + [7, 8, 9, 5])
    # Positions 1..4 seen once; 2 and 3 matched beyond the head's one accepted token; 1 was the head's; 4 missed.
    assert [gate.seen[(0, 0, j)] for j in range(1, 5)] == [1, 1, 1, 1]
    assert sorted(gate.hits) == [(0, 0, 2), (0, 0, 3)]
    assert gate.yield_at(0, 0, 2) == pytest.approx((1 + PRIOR_HITS) / (1 + PRIOR_HITS + PRIOR_MISSES))
    assert gate.yield_at(0, 0, 1) < PRIOR < gate.yield_at(0, 0, 3)

    # A chain cut to nothing is still scored: the gate keeps learning while it offers nothing.
    gate.prices(row_ms=100.0, token_ms=1.0)
    assert gate.cut([[4, 4]], source=1, start=7) == [[]]
    gate.stepped(head_accepted=0, history=history + [7, 8, 9, 5, 4, 4])
    assert gate.hits[(1, 0, 1)] == gate.hits[(1, 0, 2)] == 1


def test_copies_are_cut_where_yield_times_a_tokens_worth_drops_below_a_rows_cost():
    gate = CopyGate()
    for _ in range(20):  # position 1 always an extra token, position 2 half the time, position 3 never
        gate.cut([[1, 2, 3]], source=0, start=0)
        gate.stepped(0, [1, 2, 9] if _ % 2 else [1, 9, 9])
    y = [gate.yield_at(0, 0, j) for j in (1, 2, 3)]
    assert y[0] > y[1] > y[2]
    for row_ms, want in ((0.01, 3), (y[1] * 0.999, 2), (y[1] * 1.001, 1), (y[0] * 1.001, 0)):
        gate.prices(row_ms=row_ms, token_ms=1.0)
        assert gate.cut([[1, 2, 3]], 0, 0) == [[1, 2, 3][:want]], row_ms
    # Ranks and sources are counted apart: a second branch starts from the prior.
    assert gate.yield_at(0, 1, 1) == gate.yield_at(1, 0, 1) == pytest.approx(PRIOR)


def test_row_price_is_the_steps_own_slope_once_their_rows_spread():
    price = RowPrice()
    for i in range(2 * RowPrice.MIN_STEPS):
        price.add_step(rows=5, ms=12.5)  # no spread in the rows: no price
    assert price.row_ms is None
    for rows in (5, 9, 13, 17) * 3:
        price.add_step(rows=rows, ms=10.0 + 0.5 * rows)
    assert price.row_ms == pytest.approx(0.5)
    for i in range(50):
        price.add_step(rows=5, ms=12.5)  # later steps without copies keep the slope the spread gave
    assert price.row_ms == pytest.approx(0.5)


def test_positions_the_head_tree_holds_are_free_and_not_counted():
    gate = CopyGate()
    gate.prices(row_ms=1.0, token_ms=1.0)  # nothing past the tree pays at the prior yield
    assert gate.cut([[3, 4, 5, 6]], source=0, start=0, shared=[2]) == [[3, 4]]
    gate.stepped(head_accepted=2, history=[3, 4, 5, 0])
    # Positions 1-2 lay in the head's tree: not scored. Position 3 matched past the head's two: an extra token.
    assert sorted(gate.seen) == [(0, 0, 3), (0, 0, 4)] and sorted(gate.hits) == [(0, 0, 3)]


@pytest.fixture(scope="module")
def runner(tiny_model_dir, tiny_head_dir):
    """Its clock pinned: a token's worth (and any row price a step could learn) is a count of clock readings, the
    same on a loaded machine as on a quiet one."""
    target = LlamaTarget.load(tiny_model_dir)
    # The configured trees (no step budget): these tests put the gate's cuts against the copies it was offered.
    return Runner(target, Eagle3DraftHead.load(tiny_head_dir, target), capacity=512, clock=TickClock(), budget=False)


class FixedPrice(RowPrice):
    """A row price the steps' timings do not move."""

    def __init__(self, row_ms):
        super().__init__()
        self.row_ms = row_ms

    def add_step(self, rows, ms):
        pass


@pytest.mark.parametrize("row_ms", [1e-9, 1e9], ids=["free-rows", "dear-rows"])
def test_greedy_stays_lossless_and_copies_follow_the_price(runner, monkeypatch, row_ms):
    """A fixed row price (the rest of the gate is timing-free but a token's worth, positive after the first step and
    read on the runner's pinned clock): free rows keep every copy, dear rows cut them all after the first step
    (before any token's worth is known, copies pass whole); the text is AR's either way. The baseline grafts its
    copies whole (no gate), so the comparison is the policy against the configured tree, never against a clock."""
    prompt = [5, 6, 7, 8, 9] * 3
    tree = dict(tree="dynamic", beam_width=2, draft_length=2, total_tokens=3, lookup_tokens=6, lookup_branches=2,
                max_new_tokens=60, eos_token_ids=[])
    ar = runner.generate(prompt, DecodeConfig(mode="ar", max_new_tokens=60, eos_token_ids=[])).token_ids
    plain = runner.generate(prompt, DecodeConfig(adaptive_lookup=False, **tree))
    monkeypatch.setattr(runner, "row_price", FixedPrice(row_ms))
    gated = runner.generate(prompt, DecodeConfig(adaptive_lookup=True, **tree))
    assert gated.token_ids == plain.token_ids == ar
    sizes = [st.lookup_size for st in gated.metrics.steps]
    plain_sizes = [st.lookup_size for st in plain.metrics.steps]
    assert sum(plain_sizes[1:]) > 0
    if row_ms < 1:
        assert sizes == plain_sizes
    else:
        assert sizes[0] == plain_sizes[0] and sum(sizes[1:]) == 0


def test_sampling_keeps_its_copies_as_configured(runner, monkeypatch):
    """At T > 0 the gate stays out (a seeded run must not depend on timings)."""
    from eagle_trt.speculative import copy_gate

    monkeypatch.setattr(copy_gate.CopyGate, "cut", lambda *a, **k: pytest.fail("the gate ran at T > 0"))
    opts = dict(tree="dynamic", beam_width=2, draft_length=2, total_tokens=3, lookup_tokens=6, max_new_tokens=30,
                eos_token_ids=[], temperature=0.01, seed=3, adaptive_lookup=True)
    a = runner.generate([5, 6, 7, 8, 9] * 3, DecodeConfig(**opts))
    b = runner.generate([5, 6, 7, 8, 9] * 3, DecodeConfig(**opts))
    assert a.token_ids == b.token_ids and a.metrics.to_dict()["lookup_tokens_verified"] > 0


def test_one_default_for_an_engine_and_a_bare_runner():
    from eagle_trt.config.schema import EagleConfig

    for name in ("adaptive_lookup", "lookup_tokens", "lookup_branches", "datastore_branches", "beam_width"):
        assert getattr(EagleConfig(name="x"), name) == getattr(DecodeConfig(), name), name
