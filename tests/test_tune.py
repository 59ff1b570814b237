"""`eagle-trt tune` end to end: the CLI measures, validates and stores tuned.json into a hash-verified engine
that Session and bench then prefer; a lossless failure stores nothing; the per-step overhead measurement."""

import json

import pytest
import torch
from typer.testing import CliRunner

from eagle_trt.bench.tune_choice import Setting
from eagle_trt.cli.app import app

torch.set_num_threads(1)
cli = CliRunner()


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("tune"))


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
    assert all(r["verify_rows"] == r["total_tokens"] + 1 for r in res["ranked"]
               if r["lookup_tokens"] == 0 and r["confidence_threshold"] == 0)
    # Every tree was also scored with each default confidence threshold, charged only the rows it keeps.
    assert {r["confidence_threshold"] for r in res["ranked"]} == {0.0, 0.1, 0.2, 0.3, 0.4, 0.5}
    assert all(r["verify_rows"] <= r["total_tokens"] + 1 for r in res["ranked"] if r["lookup_tokens"] == 0)
    assert all(set(f["measured_by_variant"]) == {"fallback2", "fallback0"} for f in finals)
    assert all(f["fallback_after"] in (2, 0) for f in finals)
    assert all(abs(f["measured_tokens_per_second"] - max(f["measured_by_variant"].values())) < 1e-3 for f in finals)
    stored = json.loads((engine / "tuned.json").read_text())
    assert stored["measured_tokens_per_second"] == round(best["measured_tokens_per_second"], 3)
    assert (stored["fallback_after"], stored["lookup_tokens"], stored["lookup_branches"],
            stored["datastore_branches"], stored["max_verify_rows"], stored["confidence_threshold"]) == (
        best["fallback_after"], best["lookup_tokens"], best["lookup_branches"], best["datastore_branches"],
        best["max_verify_rows"], best["confidence_threshold"])
    # Row caps were scored where they cut copies (default --max-verify-rows 0,16,24,32), never on lookup off.
    assert {16, 24, 32} <= {r["max_verify_rows"] for r in res["ranked"]}
    assert all(r["max_verify_rows"] == 0 for r in res["ranked"] if r["lookup_tokens"] == 0)
    sizes = {int(t) for t in res["measured"]["verify_ms"]}  # up to the largest tree + root + mean copied rows
    assert {1, 16} <= sizes and max(sizes) > 65
    eng = open_engine(engine, verify=True)  # the manifest lists tuned.json with its hash
    assert "tuned.json" in eng.manifest.files
    # Readable wherever the rest of the engine is (a deployed engine may be served by another user).
    assert (engine / "tuned.json").stat().st_mode & 0o777 == (engine / "manifest.json").stat().st_mode & 0o777
    session = Session.open(engine)
    opts = session.decode_config()
    assert (opts.beam_width, opts.draft_length, opts.total_tokens, opts.fallback_after, opts.lookup_tokens,
            opts.lookup_branches, opts.max_verify_rows, opts.confidence_threshold) == (
        best["beam_width"], best["draft_length"], best["total_tokens"], best["fallback_after"], best["lookup_tokens"],
        best["lookup_branches"], best["max_verify_rows"], best["confidence_threshold"])
    assert session.decode_config(fallback_after=5).fallback_after == 5
    assert session.decode_config(tuned=False).total_tokens == 32
    assert session.decode_config(total_tokens=40).total_tokens == 40  # explicit options still win
    # Output stays identical to AR with the tuned tree.
    ids = session.encode("Hello world")
    ar = session.runner.generate(ids, session.decode_config(mode="ar", max_new_tokens=16)).token_ids
    assert session.runner.generate(ids, session.decode_config(max_new_tokens=16)).token_ids == ar
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


def test_tune_on_an_engine_it_cannot_write_fails_before_measuring(engine, monkeypatch):
    """Before: every measurement ran, then an OSError. Now one line, exit 2, before anything is measured."""
    import errno
    import tempfile

    import eagle_trt.bench.tune as tune_mod

    real = tempfile.mkstemp

    def read_only(*a, dir=None, **k):
        if dir is not None and str(dir) == str(engine):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(tune_mod, "tune_engine", lambda *a, **k: pytest.fail("measured a read-only engine"))
    r = cli.invoke(app, ["tune", "--engine", str(engine), "--limit", "1"])
    assert r.exit_code == 2 and f"engine dir '{engine}' is not writable (Permission denied)" in r.stderr
    assert "--dry-run" in r.stderr


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
    assert Session.open(copy, verify=False).decode_config().total_tokens == 32


def test_step_overhead_is_what_the_model_leaves_out(tiny_checkpoint, tmp_path):
    """On a real decode the overhead is the measured time per step minus the model's prediction for those
    steps: with a model that charges nothing it is the whole step time; it is never negative."""
    from conftest import build_tiny_engine

    from eagle_trt.bench.tune import measure_step_overhead
    from eagle_trt.runtime.session import Session

    session = Session.open(build_tiny_engine(tiny_checkpoint, tmp_path), verify=False)
    ids = session.encode("Hello world")
    seq = ids + session.runner.generate(ids, session.decode_config(mode="ar", max_new_tokens=16,
                                                                    tuned=False)).token_ids
    state = {"seq": seq, "prompt_len": len(ids)}
    tree = Setting(2, 2, 4)
    free = {"draft_ms": {(2, 2): 0.0}, "extend_ms": {1: 0.0, 8: 0.0}, "verify_ms": {1: 0.0, 64: 0.0}}
    whole = measure_step_overhead(session, state, free, tree, 16, reps=1)
    assert whole > 0
    costly = {**free, "verify_ms": {1: 1e4, 64: 1e4}}
    assert measure_step_overhead(session, state, costly, tree, 16, reps=1) == 0.0


def test_tune_prints_its_table_and_a_dry_run_stores_nothing(tiny_checkpoint, tmp_path):
    from conftest import build_tiny_engine

    engine = build_tiny_engine(tiny_checkpoint, tmp_path)  # its own: other tests here change the module's engine
    before = (engine / "manifest.json").read_text()
    for validate in ("1", "0"):  # the best line from measured runs, and from predictions alone
        r = cli.invoke(app, ["tune", "--engine", str(engine), "--limit", "2", "--max-new-tokens", "24", "--positions",
                             "4", "--max-depth", "3", "--beams", "1,2", "--validate", validate,
                             "--validate-repeats", "1", "--dry-run"])
        assert r.exit_code == 0, r.output
        assert "eagle-trt tune: predicted tokens/s" in r.stdout and "best: beam_width=" in r.stdout
        assert ("tok/s measured" in r.stdout) == (validate == "1")
        assert "dry run: nothing stored" in r.stdout
    assert (engine / "manifest.json").read_text() == before


@pytest.mark.parametrize("value, message", [
    ("0.2,high", "Error: --confidence-thresholds must be comma-separated numbers, got '0.2,high'"),
    ("0.2,1", "Error: --confidence-thresholds must lie in [0, 1), got '0.2,1'"),
    ("-0.1", "Error: --confidence-thresholds must lie in [0, 1), got '-0.1'"),
])
def test_bad_confidence_thresholds_fail_before_measuring(engine, monkeypatch, value, message):
    import eagle_trt.bench.tune as tune_mod

    monkeypatch.setattr(tune_mod, "tune_engine", lambda *a, **k: pytest.fail("measured with a bad option"))
    r = cli.invoke(app, ["tune", "--engine", str(engine), "--dry-run", "--confidence-thresholds", value])
    assert r.exit_code == 2 and r.stderr.startswith(message)
