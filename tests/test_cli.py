"""The CLI end to end through Typer's CliRunner: convert -> build -> run/inspect, and its error policy."""

import json

import pytest
from typer.testing import CliRunner

from eagle_trt.cli.app import app

cli = CliRunner()


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("cli"))


def run_json(engine, *args, env=None):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--json", *args], env=env)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_run_json_eagle_equals_ar(engine):
    for tree in ("dynamic", "static", "chain"):
        sd = run_json(engine, "--prompt", "Hello world", "--max-new-tokens", "24", "--tree", tree)
        ar = run_json(engine, "--prompt", "Hello world", "--max-new-tokens", "24", "--mode", "ar")
        assert sd["token_ids"] == ar["token_ids"] and len(sd["token_ids"]) == 24
        for key in ("acceptance_length", "tokens_per_second", "draft_ms", "verify_ms"):
            assert key in sd["metrics"]
        assert isinstance(sd["text"], str)


def test_run_no_chat_encodes_exactly_like_the_tokenizer(engine):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(engine / "tokenizer"))
    out = run_json(engine, "--prompt", "abc def", "--no-chat", "--max-new-tokens", "2")
    assert out["prompt_token_ids"] == tok("abc def").input_ids
    chat = run_json(engine, "--prompt", "abc def", "--max-new-tokens", "2")
    assert chat["prompt_token_ids"] != out["prompt_token_ids"]


def test_run_streams_text_and_prints_metrics(engine):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "Hi", "--max-new-tokens", "8"])
    assert r.exit_code == 0, r.output
    assert "acceptance length τ" in r.stdout and "tokens/s" in r.stdout


def test_run_prompt_lookup_options(engine):
    args = ("--prompt", "abc abc abc abc", "--no-chat", "--max-new-tokens", "40")
    on = run_json(engine, *args, "--lookup-tokens", "6", "--lookup-branches", "3")
    off = run_json(engine, *args, "--lookup-tokens", "0")
    ar = run_json(engine, *args, "--mode", "ar")
    assert on["token_ids"] == off["token_ids"] == ar["token_ids"]
    assert (on["options"]["lookup_tokens"], on["options"]["lookup_branches"]) == (6, 3)
    assert on["metrics"]["lookup_tokens_verified"] > 0 and off["metrics"]["lookup_tokens_verified"] == 0
    assert run_json(engine, "--prompt", "hi", "--max-new-tokens", "2")["options"]["lookup_tokens"] == 8  # config default
    # Adaptive lookup: on from the engine's config, off on request; the text is the same.
    assert on["options"]["adaptive_lookup"] is True
    whole = run_json(engine, *args, "--lookup-tokens", "6", "--lookup-branches", "3", "--no-adaptive-lookup")
    assert whole["options"]["adaptive_lookup"] is False and whole["token_ids"] == ar["token_ids"]
    r = cli.invoke(app, ["run", "--engine", str(engine), *args, "--lookup-tokens", "3"])
    assert r.exit_code == 0 and "prompt lookup: accepted / verified" in r.stdout
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--lookup-branches", "0"])
    assert r.exit_code == 2 and r.stderr.startswith("Error: --lookup-branches must be in [1, 8], got 0")
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--datastore-branches", "9"])
    assert r.exit_code == 2 and r.stderr.startswith("Error: --datastore-branches must be in [0, 8], got 9")
    assert run_json(engine, *args, "--datastore-branches", "0")["options"]["datastore_branches"] == 0


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "Error: the prompt is empty: give some text with --prompt"),
    (["--prompt", "x" * 100, "--no-chat"], "Error: the prompt has 100 tokens, more than max_input_len 64"),
    (["--prompt", "hi", "--max-new-tokens", "500"], "Error: --max-new-tokens 500 exceeds the engine's max_output_len 128"),
    (["--prompt", "hi", "--mode", "fast"], "Error: --mode must be 'eagle' or 'ar', got 'fast'"),
    (["--prompt", "hi", "--tree", "bushy"], "Error: --tree must be 'dynamic', 'static' or 'chain', got 'bushy'"),
    (["--prompt", "hi", "--beam-width", "0"], "Error: --beam-width must be in [1, 64], got 0"),
])
def test_run_bad_input_is_one_line_exit_2(engine, args, message):
    r = cli.invoke(app, ["run", "--engine", str(engine), *args])
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0].startswith(message), r.stderr
    assert "Traceback" not in r.output


def test_run_missing_engine(tmp_path):
    r = cli.invoke(app, ["run", "--engine", str(tmp_path / "nope"), "--prompt", "hi"])
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0] == f"Error: engine dir '{tmp_path / 'nope'}' does not exist"


def test_debug_variable_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_DEBUG", "1")
    r = cli.invoke(app, ["run", "--engine", str(tmp_path / "nope"), "--prompt", "hi"])
    assert r.exit_code != 0 and r.exception is not None and type(r.exception).__name__ == "InputError"


def test_inspect_prints_the_manifest(engine):
    r = cli.invoke(app, ["inspect", str(engine), "--json"])
    assert r.exit_code == 0, r.output
    manifest = json.loads(r.stdout)
    assert manifest["name"] == "tiny" and "target/model.safetensors" in manifest["files"]


def test_config_show_lists_every_field():
    r = cli.invoke(app, ["config", "show", "--json"])
    assert r.exit_code == 0
    fields = {row["field"] for row in json.loads(r.stdout)}
    for name in ("draft_length", "confidence_threshold", "eagle_architecture.hidden_size", "total_tokens",
                 "beam_width", "kv_cache_dtype", "backend", "max_input_len"):
        assert name in fields
    assert all(row["description"] for row in json.loads(r.stdout))


def test_convert_missing_model_is_exit_2(tmp_path):
    r = cli.invoke(app, ["convert", str(tmp_path / "missing"), "--output", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert str(tmp_path / "missing") in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


def test_sampling_is_seeded_and_typical_acceptance_is_labelled_lossy(engine):
    args = ["--prompt", "Hello", "--max-new-tokens", "16", "--temperature", "0.8", "--top-p", "0.9", "--seed", "7"]
    a, b = run_json(engine, *args), run_json(engine, *args)
    assert a["token_ids"] == b["token_ids"] and a["metrics"]["lossy"] is False
    assert a["metrics"]["temperature"] == 0.8
    lossy = run_json(engine, *args, "--posterior-threshold", "0.09")
    assert lossy["metrics"]["lossy"] is True and lossy["options"]["posterior_threshold"] == 0.09
    r = cli.invoke(app, ["run", "--engine", str(engine), *args, "--posterior-threshold", "0.09"])
    assert "LOSSY" in r.stdout


def test_bad_sampling_options(engine):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--top-p", "0"])
    assert r.exit_code == 2 and r.stderr.startswith("Error: --top-p must be in (0, 1], got 0.0")


def test_a_bad_clock_name_is_a_one_line_error(engine):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--max-new-tokens", "2"],
                   env={"EAGLE_TRT_CLOCK": "sundial"})
    assert r.exit_code == 2
    assert r.stderr.strip() == ("Error: EAGLE_TRT_CLOCK='sundial' is not a clock: use 'wall' (the default) or "
                                "'tick'")
    pinned = [run_json(engine, "--prompt", "abc abc abc abc", "--no-chat", "--max-new-tokens", "24",
                       env={"EAGLE_TRT_CLOCK": "tick"}) for _ in range(2)]
    assert pinned[0]["metrics"] == pinned[1]["metrics"]  # every decision, and every reported time, a count
