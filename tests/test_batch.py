"""Continuous batching (runtime/loop.py): requests that share verify passes each give their solo answer.

Greedy: every request, whatever its arrival step and whatever shares its passes, equals `--mode ar` of its prompt
alone, token for token. Seeded sampling: the same tokens as the same request alone. The batch-aware sizing trims
trees and skips drafting where it does not pay (the step budget, runtime/budget.py), and must stay lossless while it does.
"""

from __future__ import annotations

import pytest
import torch

from eagle_trt.runtime.loop import DecodeLoop
from eagle_trt.runtime.session import Session
from eagle_trt.speculative.step_budget import CostCurve
from eagle_trt.timing import TickClock


@pytest.fixture(scope="module")
def session(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    # The clock pinned (eagle_trt/timing.py): the budget's drafting times, the copy gate's prices and the drafting
    # shares are counts of clock readings, so which steps draft does not depend on the machine's load.
    return Session.open(build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("batch")), clock=TickClock())


def _prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, vocab, (int(torch.randint(2, 40, (), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _run_batch(session, jobs, arrivals, **kw) -> tuple[list[list[int]], DecodeLoop]:
    """jobs: (prompt, config) each; arrivals[i]: the step at which job i is admitted (it waits while full)."""
    batch = DecodeLoop(session.runner, **kw)
    out: dict[int, list[int]] = {}
    waiting, step, slots = list(range(len(jobs))), 0, {}
    while waiting or batch.active:
        for i in [i for i in waiting if arrivals[i] <= step]:
            slot = batch.admit(*jobs[i])
            if slot is None:
                break
            slots[id(slot)] = i
            waiting.remove(i)
        for slot in batch.step():
            out[slots[id(slot)]] = slot.request.output
        step += 1
        assert step < 5000
    return [out[i] for i in range(len(jobs))], batch


# Nearly free rows (a weight-bound pass), and rows that cost like whole forwards (compute-bound): the first keeps
# every tree, the second drafts for nobody.
CHEAP = CostCurve({1: 10.0, 64: 11.0, 512: 20.0})
DEAR = CostCurve({1: 10.0, 2: 20.0, 512: 5120.0})


@pytest.mark.parametrize("cost", [None, CHEAP, DEAR], ids=["unsized", "cheap-rows", "dear-rows"])
def test_greedy_requests_in_a_batch_equal_their_solo_plain_decoding(session, cost):
    vocab = session.runner.target.spec.vocab_size
    prompts = _prompts(8, vocab)
    lengths = [5, 40, 17, 64, 1, 33, 48, 9]
    modes = ["eagle", "eagle", "ar", "eagle", "eagle", "ar", "eagle", "eagle"]
    jobs = [(p, session.decode_config(max_new_tokens=n, mode=m)) for p, n, m in zip(prompts, lengths, modes)]
    solo = [session.runner.generate(p, session.decode_config(max_new_tokens=n, mode="ar")).token_ids
            for p, n in zip(prompts, lengths)]
    got, batch = _run_batch(session, jobs, arrivals=[0, 0, 1, 3, 3, 7, 20, 21], max_batch=4, cost=cost,
                            prefill_chunk=24)
    assert got == solo
    assert batch.steps > 0 and not batch.active


def test_dear_rows_cut_every_drafted_node_and_cheap_rows_keep_them(session):
    """The tree cut: where a row costs a whole forward, no drafted node is worth verifying (prompt-lookup copies
    go by their own gate); where rows are free, the drafted trees are verified. The answers are the same."""
    vocab = session.runner.target.spec.vocab_size
    jobs = [(p, session.decode_config(max_new_tokens=24)) for p in _prompts(4, vocab)]
    got = {}
    for name, cost in (("dear", DEAR), ("cheap", CHEAP)):
        batch = DecodeLoop(session.runner, max_batch=4, cost=cost)
        slots = [batch.admit(*job) for job in jobs]
        while batch.active:
            batch.step()
        got[name] = [s.request for s in slots]
    assert not [st for r in got["dear"] for st in r.metrics.steps if st.tree_size > st.lookup_size]
    assert [st for r in got["cheap"] for st in r.metrics.steps if st.tree_size > st.lookup_size]
    assert [r.output for r in got["dear"]] == [r.output for r in got["cheap"]]


def test_drafting_that_does_not_pay_is_left(session):
    """Rows that cost whole forwards: after the batch's first drafted steps (nothing measured yet) every request
    decodes plainly but for its probes (gaps that double); every answer is still its solo plain one."""
    vocab = session.runner.target.spec.vocab_size
    prompts = _prompts(3, vocab)
    cfg = session.decode_config(max_new_tokens=110, fallback_after=0)
    solo = [session.runner.generate(p, session.decode_config(max_new_tokens=110, mode="ar")).token_ids
            for p in prompts]
    batch = DecodeLoop(session.runner, max_batch=3, cost=DEAR)
    slots = [batch.admit(p, cfg) for p in prompts]
    while batch.active:
        batch.step()
    assert [s.request.output for s in slots] == solo
    assert batch.budget.history.steps >= 1  # drafted, and measured
    for s in slots:
        m = s.request.metrics
        assert len(m.steps) <= 6 and m.undrafted_tokens >= 90, (len(m.steps), m.undrafted_tokens)
        assert s.probe.gap > s.probe.MIN_GAP  # the probes lost: their gap grew


def test_a_pinned_clock_makes_the_batch_decide_alike_every_time(tiny_checkpoint, tmp_path):
    """Two fresh engines on TickClocks: every request the budget drafts, every tree cut and every copy verified is
    the same, step for step (on the wall clock these follow the machine's load; the tokens never do)."""
    from conftest import build_tiny_engine

    engine = build_tiny_engine(tiny_checkpoint, tmp_path)
    runs = []
    for cost in (CHEAP, CHEAP, None, None):  # a measured curve, and the one the runner's budget learns
        s = Session.open(engine, clock=TickClock(), budget=True)  # the budget on, on counted readings
        prompts = _prompts(3, s.runner.target.spec.vocab_size)
        batch = DecodeLoop(s.runner, max_batch=3, cost=cost)
        slots = [batch.admit(p, s.decode_config(max_new_tokens=60)) for p in prompts]
        while batch.active:
            batch.step()
        runs.append(([[(st.accepted, st.tree_size, st.lookup_size) for st in sl.request.metrics.steps]
                      for sl in slots], [sl.request.metrics.undrafted_tokens for sl in slots],
                     batch.budget.history.outlook()))
    assert runs[0] == runs[1] and runs[2] == runs[3]
    assert sum(runs[2][1]) > 0  # the learned curve timed a plain pass first


def test_seeded_sampling_does_not_depend_on_the_batch(session):
    vocab = session.runner.target.spec.vocab_size
    prompts = _prompts(4, vocab)
    cfgs = [session.decode_config(max_new_tokens=20, temperature=0.8, seed=s) for s in (1, 2, 3, 4)]
    solo = [session.runner.generate(p, c).token_ids for p, c in zip(prompts, cfgs)]
    got, _ = _run_batch(session, list(zip(prompts, cfgs)), arrivals=[0, 2, 2, 5], max_batch=4, cost=DEAR)
    assert got == solo


def test_a_kv_budget_queues_and_refuses(session):
    from eagle_trt.errors import InputError

    vocab = session.runner.target.spec.vocab_size
    prompt, cfg = _prompts(1, vocab)[0], session.decode_config(max_new_tokens=30)
    one = DecodeLoop(session.runner).kv_needed(prompt, cfg)
    batch = DecodeLoop(session.runner, max_batch=8, kv_budget_bytes=2 * one)
    assert batch.admit(prompt, cfg) and batch.admit(prompt, cfg)
    assert batch.admit(prompt, cfg) is None  # full: the caller queues it
    with pytest.raises(InputError, match="more than the server's budget"):
        DecodeLoop(session.runner, kv_budget_bytes=one - 1).check(prompt, cfg)


def test_a_cancelled_request_leaves_within_one_step(session):
    vocab = session.runner.target.spec.vocab_size
    flag = {"stop": False}
    batch = DecodeLoop(session.runner, max_batch=2)
    keep = batch.admit(_prompts(1, vocab)[0], session.decode_config(max_new_tokens=40))
    gone = batch.admit(_prompts(2, vocab)[1], session.decode_config(max_new_tokens=40),
                       cancelled=lambda: flag["stop"])
    batch.step()
    batch.step()
    flag["stop"] = True
    assert gone in batch.step() and batch.active == [keep]
    assert gone.request.metrics.stop_reason == "stopped"


def _started_drafters(session, n: int):
    runner, out = session.runner, []
    for prompt in _prompts(n, runner.target.spec.vocab_size):
        cache = runner.target.new_cache(128)
        _, aux = runner.target.hidden_states(torch.tensor(prompt), torch.arange(len(prompt)), cache, need_aux=True,
                                             aux_layers=runner.aux_layers)
        d = runner.drafter.fresh(128)
        d.start(torch.tensor(prompt), aux, 5)
        out.append((d, aux))
    return out


def test_trees_grown_together_are_the_trees_grown_alone(session):
    from eagle_trt.runtime.batch_drafting import batchable, grow_together

    drafters = [d for d, _ in _started_drafters(session, 3)]
    assert batchable(drafters)
    shapes = [(4, 5, None), (2, 3, None), (3, 6, float(torch.tensor(0.01).log()))]
    together = grow_together(drafters, shapes)
    for d, shape, got in zip(drafters, shapes, together):
        alone = d.grow_candidates(*shape)
        assert torch.equal(got.tokens, alone.tokens) and torch.equal(got.parents, alone.parents)
        torch.testing.assert_close(got.scores, alone.scores, atol=1e-3, rtol=1e-3)


def test_drafters_extended_together_read_what_they_read_alone(session):
    from eagle_trt.runtime.batch_drafting import extend_together

    pairs, twins = _started_drafters(session, 3), _started_drafters(session, 3)
    g = torch.Generator().manual_seed(2)
    feats = [torch.randn(k, pairs[0][1].shape[1], generator=g).to(pairs[0][1].dtype) for k in (1, 4, 2)]
    toks = [torch.randint(3, 200, (f.shape[0],), generator=g) for f in feats]
    extend_together([d for d, _ in pairs], feats, toks)
    for (d, _), (twin, _), f, t in zip(pairs, twins, feats, toks):
        twin.extend(f, t)
        assert d.cache.length == twin.cache.length
        torch.testing.assert_close(d.last_logits.float(), twin.last_logits.float(), atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(d.last_hidden.float(), twin.last_hidden.float(), atol=1e-3, rtol=1e-3)
