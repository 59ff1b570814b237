"""`eagle-trt bench` on a tiny engine: every method runs, the lossless check fires, the report is written;
plus the pure statistics and the prompt sets."""

import json

import pytest
import torch
from typer.testing import CliRunner

from eagle_trt.bench import stats
from eagle_trt.bench.prompts import Prompt, load_chat_set, load_prompts, select
from eagle_trt.cli.app import app

torch.set_num_threads(1)
cli = CliRunner()


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("bench"))


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    rows = [{"id": "a", "prompt": "Hello world"}, {"id": "b", "category": "x", "prompt": "abc abc abc", "chat": False},
            {"id": "c", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                     {"role": "user", "content": "more"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bench_runs_every_method_and_writes_the_report(engine, prompt_file, tmp_path):
    out = tmp_path / "out"
    # EAGLE_TRT_CLOCK=tick: the copy gate decides on counted clock readings, so the copies' share below does not
    # depend on the machine's load (bench still times the runs on the wall clock).
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--prompts", str(prompt_file), "--max-new-tokens", "12",
                         "--repeats", "2", "--out", str(out), "--skip-verify"], env={"EAGLE_TRT_CLOCK": "tick"})
    assert r.exit_code == 0, r.output
    assert "vs hf" in r.stdout and "roofline" in r.stdout
    assert "tree-lookup" in r.stdout and "vs hf-assisted" in r.stdout  # whole, not cut to 80 columns in logs
    res = json.loads((out / "results.json").read_text())
    assert set(res["summary"]) == {"hf", "hf-assisted", "ar", "chain", "tree", "tree-lookup"}
    assert len(res["runs"]) == 3 * 6 * 2 and not res["failures"]
    assert all(c["match"] for c in res["checks"] if c["fatal"]) and len([c for c in res["checks"] if c["fatal"]]) == 18
    # `tree` is the head alone; `tree-lookup` adds the engine's prompt-lookup branches (8 tokens x 2).
    assert res["methods"]["tree"]["lookup_tokens"] == 0
    assert (res["methods"]["tree-lookup"]["lookup_tokens"], res["methods"]["tree-lookup"]["lookup_branches"]) == (8, 2)
    assert res["summary"]["tree"]["lookup_accepted"] == 0
    assert res["summary"]["tree-lookup"]["lookup_accepted"] > 0  # the raw "abc abc abc" prompt repeats itself
    tree = res["summary"]["tree"]
    assert tree["acceptance_length"] >= 1 and tree["draft_ms_per_step"] > 0 and tree["acceptance_per_depth"]
    plain_ms = 1e3 / res["summary"]["ar"]["tokens_per_second"]["median"]
    assert tree["verify_over_plain_step"] == pytest.approx(tree["verify_ms_per_step"] / plain_ms)
    assert "verify_over_plain_step" not in res["summary"]["hf"]
    assert "verify/plain" in r.stdout and "target forward by rows" in r.stdout
    assert res["summary"]["hf"]["acceptance_length"] is None
    sp = res["speedups"]["tree"]["ar"]
    assert 0 < sp["min"] <= sp["median"]
    assert set(res["per_prompt"]) == {"a", "b", "c"}
    roof = res["roofline"]
    assert roof["roofline_tokens_per_second"] > 0 and 0 < roof["ar_fraction_of_roofline"]
    assert roof["forward_16_over_1"] > 0 and 0 < roof["tree_draft_share"] < 1
    for name in ("report.md", "tokens_per_second.png", "tau_histogram.png", "verify_cost.png"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "report.md").read_text()
    assert "Lossless: all 18" in md and "came from the prompt-lookup branch" in md and "## Roofline" in md and "| c | `tree` |" in md
    assert "verify ÷ plain step" in md


def test_a_prompt_longer_than_the_engine_is_cut_and_said_so(engine, tmp_path):
    """A prompt file line of ~500k tokens was silently benchmarked as its last 2,048 tokens (only a count in
    results.json). Now a warning on the console (even with --json), in `warnings` and in report.md."""
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"id": "huge", "prompt": "word " * 3000, "chat": False}) + "\n"
                    + json.dumps({"id": "ok", "prompt": "Hello"}) + "\n")
    out = tmp_path / "out"
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--prompts", str(path), "--max-new-tokens", "4",
                         "--methods", "ar,tree", "--out", str(out), "--skip-verify", "--no-roofline", "--no-plots",
                         "--json"])
    assert r.exit_code == 0, r.output
    assert "Warning: prompt huge has" in r.stderr and "only its last 64 are benchmarked" in r.stderr
    res = json.loads(r.stdout)
    (w,) = [w for w in res["warnings"] if w["kind"] == "truncated_prompt"]
    assert (w["prompt"], w["kept"]) == ("huge", 64) and w["tokens"] > 64
    assert res["config"]["truncated_prompts"] == 1
    assert "prompt(s) longer than the engine's max_input_len were cut" in (out / "report.md").read_text()


def test_bench_planted_mismatch_fails(engine, prompt_file, tmp_path, monkeypatch):
    from eagle_trt.bench import methods

    real = methods.OursMethod.run

    def corrupt(self, ids, n):
        out = real(self, ids, n)
        if self.name == "chain":
            out.token_ids = out.token_ids[:3] + [(out.token_ids[3] + 1) % 256] + out.token_ids[4:]
        return out

    monkeypatch.setattr(methods.OursMethod, "run", corrupt)
    out = tmp_path / "out"
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--prompts", str(prompt_file), "--limit", "1",
                         "--max-new-tokens", "8", "--repeats", "1", "--methods", "chain", "--out", str(out),
                         "--no-roofline", "--no-plots"])
    assert r.exit_code == 1, r.output
    assert "1 speculative output(s) differ from plain AR decoding (first: chain on a, token 3)" in r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["methods"] == ["ar", "chain"]
    assert res["failures"][0]["first_difference"] == 3
    assert "FAILED: 1 of 1" in (out / "report.md").read_text()


def test_bench_bad_input(engine, tmp_path):
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--methods", "tree,fast", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown method(s) fast" in r.stderr
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--prompts", "nope", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--prompts must be humaneval, chat or a .jsonl file" in r.stderr


def unusable_out(tmp_path, kind):
    """A --out that cannot take the results: a file, a dir of earlier results, a path below a file."""
    if kind == "file":
        (tmp_path / "f").write_text("x")
        return tmp_path / "f"
    if kind == "results":
        (tmp_path / "r").mkdir()
        (tmp_path / "r" / "results.json").write_text("{}")
        return tmp_path / "r"
    (tmp_path / "g").write_text("x")
    return tmp_path / "g" / "new"


@pytest.mark.parametrize("kind, message", [
    ("file", "exists and is not a directory"),
    ("results", "already holds earlier results (results.json); choose a new dir or pass --force"),
    ("below-a-file", "is not writable"),
])
def test_bench_out_is_checked_before_anything_runs(engine, prompt_file, tmp_path, monkeypatch, kind, message):
    import eagle_trt.runtime.session as session

    monkeypatch.setattr(session.Session, "open", lambda *a, **k: pytest.fail("the engine was opened"))
    out = unusable_out(tmp_path, kind)
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--prompts", str(prompt_file), "--out", str(out)])
    assert r.exit_code == 2 and r.stderr.startswith(f"Error: --out {out} ") and message in r.stderr, r.output


def test_bench_force_replaces_earlier_results(engine, prompt_file, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "results.json").write_text("{}")
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--prompts", str(prompt_file), "--limit", "1",
                         "--max-new-tokens", "4", "--repeats", "1", "--methods", "ar", "--no-roofline", "--no-plots",
                         "--out", str(out), "--force"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "results.json").read_text())["summary"]["ar"]["generated_tokens"] == 4


# ---- pure logic ----------------------------------------------------------------------------------

def test_speedups_are_per_repeat_ratios():
    tps = {"tree": [10.0, 30.0, 20.0], "ar": [5.0, 10.0, 10.0], "hf": [0.0, 1.0, 2.0]}
    sp = stats.speedups(tps, ["ar", "hf", "missing"])
    assert sp["tree"]["ar"] == {"min": 2.0, "median": 2.0}
    assert sp["ar"]["ar"] == {"min": 1.0, "median": 1.0}
    assert sp["tree"]["hf"] == {"min": 10.0, "median": 20.0}  # the zero-throughput repeat is skipped
    assert "missing" not in sp["tree"]


def test_throughput_acceptance_and_differences():
    runs = [{"method": "m", "repeat": 0, "tokens": 10, "seconds": 1.0},
            {"method": "m", "repeat": 0, "tokens": 30, "seconds": 1.0},
            {"method": "m", "repeat": 1, "tokens": 40, "seconds": 4.0}]
    assert stats.throughput_per_repeat(runs, "m", 2) == [20.0, 10.0]
    acc = stats.acceptance([(2, 3), (0, 3), (1, 1)])
    assert acc.tau == pytest.approx(2.0) and acc.per_depth == [pytest.approx(2 / 3), 0.5, 0.0]
    assert stats.acceptance([]).tau == 1.0
    assert stats.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert stats.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert stats.first_difference([1, 2], [1, 2, 3]) == 2
    assert stats.summarize([4.0, 1.0, 3.0])["median"] == 3.0
    assert stats.roofline(100, 1000.0) == 10.0


def test_output_checks_follow_the_reference_map():
    """check_outputs uses REFERENCE by default and a caller's map (tune's finalist names) when given."""
    from eagle_trt.bench.harness import check_outputs

    runs = [{"repeat": 0, "prompt": "p", "method": m, "token_ids": ids, "tokens": len(ids)}
            for m, ids in (("ar", [1, 2, 3]), ("tree", [1, 2, 3]), ("8x2x6/fallback0", [1, 9, 3]))]
    assert [(c["method"], c["match"]) for c in check_outputs(runs)] == [("tree", True)]
    custom = check_outputs(runs, {"8x2x6/fallback0": ("ar", True)})
    assert [(c["method"], c["match"], c["fatal"], c["first_difference"]) for c in custom] == [
        ("8x2x6/fallback0", False, True, 1)]


def test_plain_step_ratios_put_verify_and_draft_in_plain_steps():
    summary = {"ar": {"tokens_per_second": {"median": 20.0}, "verify_ms_per_step": None, "draft_ms_per_step": None},
               "tree": {"tokens_per_second": {"median": 30.0}, "verify_ms_per_step": 125.0, "draft_ms_per_step": 25.0},
               "hf": {"tokens_per_second": {"median": 10.0}}}
    assert stats.plain_step_ratios(summary) == {"tree": {"verify": 2.5, "draft": 0.5}}  # a plain step: 50 ms
    assert stats.plain_step_ratios({"tree": summary["tree"]}) == {}  # no plain run, no unit
    assert stats.plain_step_ratios({**summary, "ar": {"tokens_per_second": {"median": 0.0}}}) == {}


def test_the_curve_line_names_rows_ms_and_ratios():
    from eagle_trt.bench.report import curve_line

    line = curve_line({"context_tokens": 40, "forward_ms": {"4": 12.0, "1": 10.0, "16": 25.0}})
    assert line == ("target forward by rows (40 cached tokens): 1: 10.0 ms, 4: 12.0 ms (1.20×), "
                    "16: 25.0 ms (2.50×)")
    assert curve_line(None) is None and curve_line({"forward_ms": {}}) is None


def test_hf_methods_are_left_out_where_transformers_cannot_read_the_engine():
    """A target in GGUF blocks (the default for a GGUF): the default methods skip hf and hf-assisted, and naming
    them is one input error saying why and what to do; a draft model in blocks drops hf-assisted only."""
    from types import SimpleNamespace

    from eagle_trt.bench.methods import check_hf, default_methods
    from eagle_trt.errors import InputError

    def session(weights, draft_weights="float", kind="eagle3"):
        return SimpleNamespace(weights=weights, draft_weights=draft_weights, draft_kind=kind, tuned={})

    assert default_methods(session("float"))[:3] == ["hf", "hf-assisted", "ar"]
    blocks = session("q4_k+q6_k")
    assert default_methods(blocks) == ["ar", "chain", "tree", "tree-lookup"]
    with pytest.raises(InputError, match=r"--methods: hf: the engine's target is stored in GGUF blocks "
                                         r"\(weights: q4_k\+q6_k\), which transformers cannot read; leave them out, "
                                         r"or build the engine with weights: float"):
        check_hf(["hf", "ar"], blocks)
    check_hf(["ar", "tree"], blocks)
    dm = session("float", "q4_k+q6_k", "model")
    assert "hf-assisted" not in default_methods(dm) and "hf" in default_methods(dm)
    with pytest.raises(InputError, match="hf-assisted: the engine's draft model is stored in GGUF blocks"):
        check_hf(["hf-assisted"], dm)
    check_hf(["hf"], dm)


def test_interpolate():
    curve = {1: 10.0, 4: 10.0, 8: 18.0}
    assert stats.interpolate(curve, 6) == pytest.approx(14.0)
    assert stats.interpolate(curve, 4) == 10.0
    assert stats.interpolate(curve, 16) == pytest.approx(34.0)  # linear past the end
    assert stats.interpolate({3: 2.0}, 9) == 2.0


def test_prompt_sets():
    chat = load_chat_set()
    cats = {p.category for p in chat}
    assert 45 <= len(chat) <= 60 and len({p.id for p in chat}) == len(chat)
    assert {"writing", "coding", "reasoning", "extraction", "translation", "summarization", "multi-turn"} <= cats
    assert any(len(p.messages) == 3 for p in chat)
    mixed = select(chat, 7)
    assert len({p.category for p in mixed}) == 7
    he = load_prompts("humaneval", 2)
    assert he[0].id == "HumanEval/0" and he[0].text.startswith("from typing import List") and not he[0].chat


def test_several_prompt_sets_join_each_cut_to_the_limit(tmp_path):
    import json as _json
    from pathlib import Path

    code = tmp_path / "code.jsonl"
    code.write_text("".join(_json.dumps({"prompt": f"def f{i}():\n", "chat": False}) + "\n" for i in range(5)))
    both = load_prompts(f"chat,{code}", 3)
    assert [p.id for p in both] == ["chat:writing-01", "chat:coding-01", "chat:reasoning-01", "code:p001",
                                    "code:p002", "code:p003"]
    assert [p.chat for p in both] == [True] * 3 + [False] * 3
    # The shipped held-out code calibration set: none of its stubs is in the demo head's training prompts.
    repo = Path(__file__).resolve().parents[1]
    held = {p.text for p in load_prompts(str(repo / "data" / "code_calibration.jsonl"))}
    train = {p.text for p in load_prompts(str(repo / "data" / "code_prompts.jsonl"))}
    assert len(held) == 24 and not held & train


def test_prompt_file_errors(tmp_path):
    from eagle_trt.errors import InputError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nothing": 1}\n')
    with pytest.raises(InputError, match="bad.jsonl:2: needs a non-empty 'prompt'"):
        load_prompts(str(bad))
    with pytest.raises(InputError, match="--limit must be >= 1"):
        load_prompts("chat", 0)
    bad.write_text('{"messages": [{"role": "wizard", "content": "hi"}]}\n')
    with pytest.raises(InputError, match="bad.jsonl:1: 'messages' must be .* role one of system, developer, user, "
                                         "assistant, tool"):
        load_prompts(str(bad))


def test_prompt_encoding_uses_the_chat_template(engine):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(engine / "tokenizer"))
    chat = Prompt("x", "c", messages=[{"role": "user", "content": "hi"}])
    assert chat.encode(tok) == list(tok.apply_chat_template(chat.messages, add_generation_prompt=True,
                                                            tokenize=True)["input_ids"])
    raw = Prompt("y", "c", text="abc", chat=False)
    assert raw.encode(tok) == tok("abc").input_ids


def test_roofline_bandwidth_is_the_best_measured(monkeypatch):
    """The roofline's bandwidth is a ceiling: the fastest copy repeat, and the best of bench's measurements before
    and after its runs (a slow moment on a shared machine must not put plain decoding above 100% of it)."""
    from eagle_trt.bench import report, roofline

    readings = iter([0.0, 0.5, 1.0, 1.1, 2.0, 2.3])  # start and end of three timed copies: 0.5, 0.1 and 0.3 s
    assert roofline.copy_bandwidth(1, reps=3, clock=lambda: next(readings)) == pytest.approx(2 * (1 << 20) / 0.1)

    monkeypatch.setattr(roofline, "copy_bandwidth", lambda mb: 20e9)
    monkeypatch.setattr(roofline, "target_weight_bytes", lambda target: 1000)
    monkeypatch.setattr(roofline, "forward_curve", lambda *a: {1: 0.01})
    fast_before = roofline.measure_machine(None, 8, 4, earlier_bandwidth=(30e9,))
    assert fast_before["copy_bandwidth_gb_s"] == pytest.approx(30.0)
    assert fast_before["copy_bandwidth_samples_gb_s"] == [pytest.approx(30.0), pytest.approx(20.0)]
    assert roofline.measure_machine(None, 8, 4, earlier_bandwidth=(10e9,))["copy_bandwidth_gb_s"] == pytest.approx(20)
    line = report._roofline_md({"machine": fast_before, "roofline": {"weight_mb_per_token": 1.0,
                                                                      "roofline_tokens_per_second": 30.0}})[2]
    assert "30.00 GB/s (the best of 30.00, 20.00 GB/s measured in this run" in line
