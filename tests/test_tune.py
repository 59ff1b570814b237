"""`eagle-trt tune`: the choice logic on synthetic curves, the replay scorer, and storing tuned.json
into a hash-verified engine that Session then prefers."""

import json

import pytest
import torch
from typer.testing import CliRunner

from eagle_trt.bench.tune_choice import (
    LOOKUP_OFF,
    Setting,
    candidate_count,
    candidate_settings,
    choose,
    lookup_grid,
    predict_tps,
)
from eagle_trt.bench.stats import interpolate
from eagle_trt.bench.tune_replay import accepted_lengths
from eagle_trt.cli.app import app

torch.set_num_threads(1)
cli = CliRunner()


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
    rows, ms = {copies: 12.0}, {(8, 2, 0): 0.5}
    flat = choose(taus, {1: 10.0, 64: 10.5}, draft, extend, rows, ms)
    assert flat[0]["lookup_tokens"] == 8 and flat[0]["lookup_rows"] == 12.0 and flat[0]["lookup_ms"] == 0.5
    assert flat[0]["predicted_tokens_per_second"] == pytest.approx(
        predict_tps(2.0, 1.0, 0.1 + 0.1 * 1.0 / 3, 10.0 + 0.5 * 14 / 63, 0.5))
    steep = choose(taus, {1: 10.0, 2: 20.0, 64: 640.0}, draft, extend, rows, ms)
    assert steep[0]["lookup_tokens"] == 0 and steep[0]["lookup_rows"] == 0


def test_choose_charges_each_step_at_its_own_verify_size():
    """On a curve with a step (bf16: a second pass over the weights past 32 rows) the cost is the mean over the
    steps' sizes, not the cost at their mean size: copies that sometimes cross the step lose to capped ones."""
    from eagle_trt.bench.tune_choice import row_caps

    draft, extend = {(2, 1): 1.0}, {1: 0.0, 8: 0.0}
    cliff = {1: 10.0, 32: 10.0, 33: 20.0, 64: 20.0}
    free, capped = Setting(2, 1, 2, 8, 4, 0), Setting(2, 1, 2, 8, 4, 0, 32)
    assert capped.copy_budget == 29 and row_caps(free.tree, free.lookup, [3, 4, 32, 35]) == [0, 4, 32]
    taus = {free: 3.0, capped: 2.9}
    spread = {free: {4: 0.75, 32: 0.25}, capped: {4: 0.75, 29: 0.25}}
    ranked = choose(taus, cliff, draft, extend, spread)
    assert ranked[0]["max_verify_rows"] == 32
    by = {r["max_verify_rows"]: r for r in ranked}
    assert by[0]["verify_ms"] == pytest.approx(0.75 * 10 + 0.25 * 20) and by[0]["lookup_rows"] == pytest.approx(11)
    assert by[32]["verify_ms"] == pytest.approx(10.0)
    # Charged at the mean size (11 rows) instead, the uncapped copies would have looked better.
    assert choose(taus, cliff, draft, extend, {free: 11.0, capped: 10.25})[0]["max_verify_rows"] == 0


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


def test_accepted_lengths_replays_greedy_verification():
    # Candidates (creation order): depth 1: A(-1) B(-1); depth 2: A->C, A->D, B->E.
    tokens = torch.tensor([10, 11, 12, 13, 14])
    parents = torch.tensor([-1, -1, 0, 0, 1])
    depths = torch.tensor([1, 1, 2, 2, 2])
    scores = torch.tensor([-0.1, -1.0, -0.5, -0.2, -1.5])
    cont = [10, 13, 99]
    out = accepted_lengths(scores, parents, depths, tokens, cont, [(1, 1), (2, 1), (2, 2), (2, 4), (2, 5)])
    # N=1 keeps A only; N=2 keeps A, D (score -0.2 beats B's -1.0): A->D matches both steps.
    assert out == {(1, 1): 1, (2, 1): 1, (2, 2): 2, (2, 4): 2, (2, 5): 2}
    miss = accepted_lengths(scores, parents, depths, tokens, [11, 14], [(2, 2), (2, 5)])
    assert miss == {(2, 2): 0, (2, 5): 2}  # B is only kept in the larger tree


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("tune"))


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

    session = Session.open(engine, verify=False)
    ids = session.encode("Hello world")
    ar = session.runner.generate(ids, session.decode_options(mode="ar", max_new_tokens=24, tuned=False)).token_ids
    drafter = session.runner.drafter
    monkeypatch.setattr(drafter, "grow_candidates", _oracle_candidates(drafter, ids + ar))
    seen = set()
    for st in (Setting(4, 3, 8), Setting(2, 4, 5), Setting(1, 2, 2)):
        opts = session.decode_options(tree="dynamic", beam_width=st.beam_width, draft_length=st.draft_length,
                                      total_tokens=st.total_tokens, max_new_tokens=24, fallback_after=0,
                                      lookup_tokens=0, tuned=False)
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
        assert [min(per_root[roots[i]][st], end - roots[i]) for i in keep] == accepted
        seen.update(accepted)
    assert len(seen) >= 3  # zero, partial and deep acceptance were all compared


def test_lookup_replay_matches_the_runtime_step_by_step(engine, monkeypatch):
    """The copies the replay scores at each verify step's root are the runtime's: same accepted count, same rows,
    with context copies and a datastore, when the head's own drafts are all wrong."""
    from eagle_trt.bench.tune_replay import calibrate, lookup_replay
    from eagle_trt.runtime.drafter import Candidates
    from eagle_trt.runtime.session import Session
    from eagle_trt.speculative.datastore import Datastore

    session = Session.open(engine, verify=False)
    runner = session.runner
    ids = session.encode("Hello world, hello world")
    ar = runner.generate(ids, session.decode_options(mode="ar", max_new_tokens=40, tuned=False)).token_ids
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
        opts = session.decode_options(tree="dynamic", beam_width=1, draft_length=1, total_tokens=1,
                                      max_new_tokens=40, fallback_after=0, lookup_tokens=lk[0], lookup_branches=lk[1],
                                      datastore_branches=lk[2], max_verify_rows=cap, tuned=False)
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
        replayed = lookup_replay(seq, len(ids), [roots[i] for i in keep], [(lk, budget)], store)
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
        assert sum(r * p for r, p in spread.items()) == pytest.approx(sum(st.lookup_size for st in steps) / len(steps))
    assert len(seen) >= 3  # misses, partial and long copies were all compared
    assert discarded  # some final step verified tokens past max_new_tokens, and they were not counted


def test_tune_stores_verified_defaults_that_session_and_bench_use(engine, tmp_path):
    from eagle_trt.engine import open_engine
    from eagle_trt.runtime.session import Session

    r = cli.invoke(app, ["tune", "--engine", str(engine), "--limit", "2", "--max-new-tokens", "24", "--positions",
                         "4", "--max-depth", "6", "--beams", "1,4", "--validate", "2", "--validate-repeats", "1",
                         "--json", "--top", "100000"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    best = res["best"]
    assert res["stored"] and res["default"]["total_tokens"] == 32 and res["default"]["beam_width"] == 8
    # The two best-predicted settings and the build default ran end to end; the fastest measured one won.
    val = res["validation"]
    finals = val["finalists"]
    assert val["mismatches"] == [] and val["ar_tokens_per_second"] > 0
    assert finals[:2] == res["ranked"][:2] and res["default"] in finals
    assert best in finals and all(best["measured_tokens_per_second"] >= f["measured_tokens_per_second"] for f in finals)
    # Lookup settings were ranked with the trees (the build default carries the engine's 8 x 2 copies), the best
    # setting without lookup also ran, and each finalist ran with the plain-decoding fallback on (after 2 misses)
    # and off; the fastest variant counts.
    assert (res["default"]["lookup_tokens"], res["default"]["lookup_branches"]) == (8, 2)
    assert any(r["lookup_tokens"] == 0 for r in finals)
    assert {"4x1+0", "8x2+0", "12x4+0"} <= set(res["measured"]["lookup_ms"])  # no datastore: no "+1"
    assert not any(k.endswith("+1") for k in res["measured"]["lookup_ms"])
    assert all(r["lookup_rows"] == 0 for r in res["ranked"] if r["lookup_tokens"] == 0)
    assert all(set(f["measured_by_variant"]) == {"fallback2", "fallback0"} for f in finals)
    assert all(f["fallback_after"] in (2, 0) for f in finals)
    assert all(abs(f["measured_tokens_per_second"] - max(f["measured_by_variant"].values())) < 1e-3 for f in finals)
    stored = json.loads((engine / "tuned.json").read_text())
    assert stored["measured_tokens_per_second"] == round(best["measured_tokens_per_second"], 3)
    assert (stored["fallback_after"], stored["lookup_tokens"], stored["lookup_branches"],
            stored["datastore_branches"], stored["max_verify_rows"]) == (
        best["fallback_after"], best["lookup_tokens"], best["lookup_branches"], best["datastore_branches"],
        best["max_verify_rows"])
    # Row caps were scored where they cut copies (default --max-verify-rows 0,16,24,32), never on lookup off.
    assert {16, 24, 32} <= {r["max_verify_rows"] for r in res["ranked"]}
    assert all(r["max_verify_rows"] == 0 for r in res["ranked"] if r["lookup_tokens"] == 0)
    sizes = {int(t) for t in res["measured"]["verify_ms"]}  # up to the largest tree + root + mean copied rows
    assert {1, 16} <= sizes and max(sizes) > 65
    eng = open_engine(engine, verify=True)  # the manifest lists tuned.json with its hash
    assert "tuned.json" in eng.manifest.files
    session = Session.open(engine)
    opts = session.decode_options()
    assert (opts.beam_width, opts.draft_length, opts.total_tokens, opts.fallback_after, opts.lookup_tokens,
            opts.lookup_branches, opts.max_verify_rows) == (
        best["beam_width"], best["draft_length"], best["total_tokens"], best["fallback_after"], best["lookup_tokens"],
        best["lookup_branches"], best["max_verify_rows"])
    assert session.decode_options(fallback_after=5).fallback_after == 5
    assert session.decode_options(tuned=False).total_tokens == 32
    assert session.decode_options(total_tokens=40).total_tokens == 40  # explicit options still win
    # Output stays identical to AR with the tuned tree.
    ids = session.encode("Hello world")
    ar = session.runner.generate(ids, session.decode_options(mode="ar", max_new_tokens=16)).token_ids
    assert session.runner.generate(ids, session.decode_options(max_new_tokens=16)).token_ids == ar
    # The bench compares the tuned tree with the build defaults.
    out = tmp_path / "b"
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--prompts", "chat", "--limit", "2", "--max-new-tokens",
                         "8", "--repeats", "1", "--methods", "tree,tree-untuned", "--out", str(out), "--no-plots",
                         "--no-roofline"])
    assert r.exit_code == 0, r.output
    bench = json.loads((out / "results.json").read_text())
    assert bench["tuned"]["total_tokens"] == best["total_tokens"]
    assert bench["methods"]["tree-untuned"]["total_tokens"] == 32
    assert "tree-untuned" in bench["speedups"]["tree"]
    # Tampering with tuned.json is caught like any engine file.
    tuned = engine / "tuned.json"
    tuned.write_text(tuned.read_text().replace('"total_tokens": ', '"total_tokens":  '))
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi"])
    assert r.exit_code == 2 and "tuned.json" in r.stderr


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


def test_tune_refuses_to_store_after_a_lossless_failure(tiny_checkpoint, tmp_path, monkeypatch):
    """A speculative output that differs from AR during validation is a bug: exit 1, store nothing."""
    import eagle_trt.bench.tune as tune_mod
    from conftest import build_tiny_engine

    engine = build_tiny_engine(tiny_checkpoint, tmp_path)
    real = tune_mod.measure_end_to_end

    def broken(session, encoded, max_new_tokens, settings, repeats=2, fallbacks=(2,)):
        out = real(session, encoded, max_new_tokens, settings, repeats, fallbacks)
        return {**out, "mismatches": [(settings[0], fallbacks[0])]}

    monkeypatch.setattr(tune_mod, "measure_end_to_end", broken)
    before = (engine / "manifest.json").read_text()
    r = cli.invoke(app, ["tune", "--engine", str(engine), "--limit", "1", "--max-new-tokens", "12", "--positions",
                         "2", "--max-depth", "3", "--beams", "1", "--validate", "1", "--validate-repeats", "1",
                         "--lookup-tokens", "0"])
    assert r.exit_code == 1 and "differed from plain AR" in r.stderr
    assert (engine / "manifest.json").read_text() == before


def test_unlisted_tuned_json_is_ignored(engine, tmp_path):
    import shutil

    from eagle_trt.runtime.session import Session

    copy = tmp_path / "engine"
    shutil.copytree(engine, copy)
    (copy / "tuned.json").unlink(missing_ok=True)
    from eagle_trt.engine.manifest import read_manifest, write_manifest

    m = read_manifest(copy)
    files = {k: v for k, v in m.files.items() if k != "tuned.json"}
    write_manifest(m.model_copy(update={"files": files}), copy)
    (copy / "tuned.json").write_text(json.dumps({"total_tokens": 3, "draft_length": 1, "beam_width": 1}))
    assert Session.open(copy, verify=False).decode_options().total_tokens == 32


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


def test_step_overhead_is_what_the_model_leaves_out(tiny_checkpoint, tmp_path):
    """On a real decode the overhead is the measured time per step minus the model's prediction for those
    steps: with a model that charges nothing it is the whole step time; it is never negative."""
    from conftest import build_tiny_engine

    from eagle_trt.bench.tune import measure_step_overhead
    from eagle_trt.runtime.session import Session

    session = Session.open(build_tiny_engine(tiny_checkpoint, tmp_path), verify=False)
    ids = session.encode("Hello world")
    seq = ids + session.runner.generate(ids, session.decode_options(mode="ar", max_new_tokens=16,
                                                                    tuned=False)).token_ids
    state = {"seq": seq, "prompt_len": len(ids)}
    tree = Setting(2, 2, 4)
    free = {"draft_ms": {(2, 2): 0.0}, "extend_ms": {1: 0.0, 8: 0.0}, "verify_ms": {1: 0.0, 64: 0.0}}
    whole = measure_step_overhead(session, state, free, tree, 16, reps=1)
    assert whole > 0
    costly = {**free, "verify_ms": {1: 1e4, 64: 1e4}}
    assert measure_step_overhead(session, state, costly, tree, 16, reps=1) == 0.0
