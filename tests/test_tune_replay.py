"""`eagle-trt tune`, acceptance by replay: the scorer against greedy verification, and replay, lookup replay
and calibration against the decode loop itself, step by step and in total (with copies, a datastore, caps)."""

import pytest
import torch

from eagle_trt.bench.tune_choice import Setting
from eagle_trt.bench.tune_replay import accepted_lengths
from eagle_trt.timing import TickClock

torch.set_num_threads(1)


def test_accepted_lengths_replays_greedy_verification():
    # Candidates (creation order): depth 1: A(-1) B(-1); depth 2: A->C, A->D, B->E.
    tokens = torch.tensor([10, 11, 12, 13, 14])
    parents = torch.tensor([-1, -1, 0, 0, 1])
    depths = torch.tensor([1, 1, 2, 2, 2])
    scores = torch.tensor([-0.1, -1.0, -0.5, -0.2, -1.5])
    cont = [10, 13, 99]
    trees = [(1, 1, 0.0), (2, 1, 0.0), (2, 2, 0.0), (2, 4, 0.0), (2, 5, 0.0)]
    out = accepted_lengths(scores, parents, depths, tokens, cont, trees)
    # N=1 keeps A only; N=2 keeps A, D (score -0.2 beats B's -1.0): A->D matches both steps.
    assert out == {(1, 1, 0.0): (1, 1), (2, 1, 0.0): (1, 1), (2, 2, 0.0): (2, 2), (2, 4, 0.0): (2, 4),
                   (2, 5, 0.0): (2, 5)}
    miss = accepted_lengths(scores, parents, depths, tokens, [11, 14], [(2, 2, 0.0), (2, 5, 0.0)])
    assert miss == {(2, 2, 0.0): (0, 2), (2, 5, 0.0): (2, 5)}  # B is only kept in the larger tree
    # A threshold keeps only the candidates at least that likely: p 0.5 keeps A (0.90), D (0.82), C (0.61);
    # p 0.95 none, so the step verifies the root alone and accepts nothing.
    sure = accepted_lengths(scores, parents, depths, tokens, cont, [(2, 5, 0.5), (2, 5, 0.95), (1, 5, 0.5)])
    assert sure == {(2, 5, 0.5): (2, 3), (2, 5, 0.95): (0, 0), (1, 5, 0.5): (1, 1)}


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("tune-replay"))


def _oracle_candidates(drafter, seq):
    """Candidates that hold the true continuation of `seq` (corrupted at some depths) among wrong siblings,
    so replay and the decode loop both see real, varied acceptance instead of the random head's zeros."""
    from eagle_trt.runtime.drafter import Candidates

    def grow(beam_width, depth, min_score=None):
        n = drafter.length  # the root sits at position n
        truth = list(seq[n + 1 : n + 1 + depth])
        if n % 3 == 0 and len(truth) > 1:
            truth[1] = (truth[1] + 1) % 250  # a wrong token mid-path: acceptance must stop there
        scores, parents, depths, tokens = [], [], [], []
        prev = -1
        for d, tok in enumerate(truth, start=1):
            right = len(tokens)
            for j in range(min(beam_width, 2)):  # the right child, then a wrong sibling ranked below it
                scores.append(-0.1 * d - j)
                parents.append(prev)
                depths.append(d)
                tokens.append(tok if j == 0 else (tok + 7) % 250)
            prev = right
        return Candidates(torch.tensor(scores), torch.tensor(parents), torch.tensor(depths), torch.tensor(tokens))

    return grow


def test_replay_matches_the_runtime_step_by_step(engine, monkeypatch):
    """The replayed acceptance at each verify step's root equals what the decode loop accepted there."""
    from eagle_trt.bench.tune_replay import replay
    from eagle_trt.runtime.session import Session

    session = Session.open(engine, verify=False, clock=TickClock(), budget=False)  # the configured trees
    ids = session.encode("Hello world")
    ar = session.runner.generate(ids, session.decode_config(mode="ar", max_new_tokens=24, tuned=False)).token_ids
    drafter = session.runner.drafter
    monkeypatch.setattr(drafter, "grow_candidates", _oracle_candidates(drafter, ids + ar))
    seen, sizes = set(), {}
    # The oracle's right path scores -0.1 a level (p 0.90, 0.82, 0.74, 0.67), each wrong sibling 1 below it
    # (p 0.33, 0.30, ...): p 0.8 keeps the right path's first two levels, p 0.5 its four.
    for st in (Setting(4, 3, 8), Setting(2, 4, 5), Setting(1, 2, 2), Setting(4, 3, 8, confidence_threshold=0.8),
               Setting(2, 4, 5, confidence_threshold=0.5)):
        opts = session.decode_config(tree="dynamic", beam_width=st.beam_width, draft_length=st.draft_length,
                                      total_tokens=st.total_tokens, confidence_threshold=st.confidence_threshold,
                                      max_new_tokens=24, fallback_after=0, lookup_tokens=0, tuned=False)
        res = session.runner.generate(ids, opts)
        assert res.token_ids == ar
        roots, n = [], len(ids)
        for step in res.metrics.steps:
            roots.append(n)
            n += step.accepted + 1
        keep = [i for i, r in enumerate(roots) if r + st.draft_length < len(ids) + len(ar)]
        per_root, _ = replay(session, ids + ar, [roots[i] for i in keep], [st])
        accepted = [res.metrics.steps[i].accepted for i in keep]
        # (a step that reaches the end of the output commits only what is left: its bonus token is not emitted)
        end = len(ids) + len(ar) - 2
        assert [min(per_root[roots[i]][st][0], end - roots[i]) for i in keep] == accepted
        # The rows each step verified besides the root: the whole tree, or what the threshold kept of it.
        assert [per_root[roots[i]][st][1] for i in keep] == [res.metrics.steps[i].tree_size for i in keep]
        seen.update(accepted)
        sizes[st] = {res.metrics.steps[i].tree_size for i in keep}
    assert len(seen) >= 3  # zero, partial and deep acceptance were all compared
    # The oracle offers 2 candidates a level: 6 in all at depth 3, cut to 2 by p 0.8; 5 of 8 at depth 4, cut to 4.
    assert sizes[Setting(4, 3, 8)] == {6} and sizes[Setting(4, 3, 8, confidence_threshold=0.8)] == {2}
    assert sizes[Setting(2, 4, 5)] == {5} and sizes[Setting(2, 4, 5, confidence_threshold=0.5)] == {4}


def test_lookup_replay_matches_the_runtime_step_by_step(engine, monkeypatch):
    """The copies the replay scores at each verify step's root are the runtime's: same accepted count, same rows,
    with context copies and a datastore, when the head's own drafts are all wrong."""
    from eagle_trt.bench.tune_replay import calibrate, lookup_replay
    from eagle_trt.runtime.drafter import Candidates
    from eagle_trt.runtime.session import Session
    from eagle_trt.speculative.datastore import Datastore

    session = Session.open(engine, verify=False, clock=TickClock(), budget=False)  # the configured trees
    runner = session.runner
    ids = session.encode("Hello world, hello world")
    ar = runner.generate(ids, session.decode_config(mode="ar", max_new_tokens=40, tuned=False)).token_ids
    seq = ids + ar
    vocab = runner.target.spec.vocab_size
    # A datastore holding pieces of the true output (and a decoy), so the copies are right often but not always.
    store = Datastore(torch.tensor(ar[:12] + [-1] + [(t + 1) % vocab for t in ar] + [-1] + ar[20:]))
    monkeypatch.setattr(runner, "datastore", store)
    wrong = vocab - 1  # the head drafts one token nobody continues with (checked below)
    assert wrong not in seq

    def grow(beam_width, depth, min_score=None):
        return Candidates(torch.tensor([-0.1]), torch.tensor([-1]), torch.tensor([1]), torch.tensor([wrong]))

    monkeypatch.setattr(runner.drafter, "grow_candidates", grow)
    # (lookup setting, max_verify_rows): the caps leave the copies 4 and 3 of their rows (root + 1 head node).
    lookups = [((6, 1, 0), 0), ((4, 2, 1), 0), ((8, 1, 2), 0), ((8, 1, 2), 6), ((4, 2, 1), 5)]
    seen, discarded = set(), 0
    for lk, cap in lookups:
        opts = session.decode_config(tree="dynamic", beam_width=1, draft_length=1, total_tokens=1,
                                      max_new_tokens=40, fallback_after=0, lookup_tokens=lk[0], lookup_branches=lk[1],
                                      datastore_branches=lk[2], max_verify_rows=cap, tuned=False,
                                      adaptive_lookup=False)  # tune replays the copies grafted whole
        res = runner.generate(ids, opts)
        assert res.token_ids == ar
        # Steps count what they committed: the prefill's token, then accepted + bonus per step (the last one
        # cut at max_new_tokens), add up to the output.
        steps = res.metrics.steps
        discarded += res.metrics.discarded_tokens
        assert 1 + sum(st.accepted + 1 for st in steps) == len(ar) and res.metrics.fallback_tokens == 0
        roots, n = [], len(ids)
        for step in res.metrics.steps:
            roots.append(n)
            n += step.accepted + 1
        keep = [i for i, r in enumerate(roots) if r + lk[0] < len(seq)]
        setting = Setting(1, 1, 1, *lk, cap)
        budget = setting.copy_budget
        assert budget == (cap - 2 if cap else None)
        if cap:
            assert max(st.lookup_size for st in steps) == budget  # the cap binds in this run
        replayed = lookup_replay(seq, len(ids), [roots[i] for i in keep], [(lk, budget)], store, len(ids) + 40)
        for i in keep:
            step = res.metrics.steps[i]
            copied, rows = replayed[roots[i]][(lk, budget)]
            assert (min(copied, len(seq) - 2 - roots[i]), rows) == (step.accepted, step.lookup_size)
            seen.add(step.accepted)
        # The whole calibration (replay at every position, then the walk) gives this run's tau and rows exactly.
        taus, rows, _ = calibrate(session, [ids], 40, 0, [Setting(1, 1, 1)], [lk], caps=[cap] if cap else [])
        assert taus[setting] == pytest.approx(res.metrics.acceptance_length)
        spread = rows[setting]
        assert sum(spread.values()) == pytest.approx(1.0)
        # Rows besides the root: the head's one node and the copies.
        assert sum(r * p for r, p in spread.items()) == pytest.approx(sum(st.tree_size for st in steps) / len(steps))
        assert all(st.tree_size == 1 + st.lookup_size for st in steps)
    assert len(seen) >= 3  # misses, partial and long copies were all compared
    assert discarded  # some final step verified tokens past max_new_tokens, and they were not counted
