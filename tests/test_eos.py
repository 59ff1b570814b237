"""One definition of the end tokens (eagle_trt.eos): config.json, generation_config.json and the tokenizer's eos_token,
used by run (eagle and ar), bench's HF baselines and convert alike. An end-of-turn id that only generation_config.json
names (Qwen2.5-Instruct's 151643) stops generation."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.eos import eos_from_files, eos_token_ids

cli = CliRunner()


def test_union_of_every_declaration(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 11]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 13, "content": "<|im_end|>"}],
                                                         "model": {"vocab": {"a": 0}}}))
    assert eos_from_files(tmp_path) == [7, 11, 13]
    assert eos_token_ids(None, 3, [3, 4], True, -1) == [3, 4]
    assert eos_from_files(tmp_path / "missing") == []


@pytest.fixture(scope="module")
def stop_token_engine(tiny_checkpoint, tmp_path_factory):
    """An engine whose generation_config.json alone names, as an end token, a token the greedy answer reaches."""
    from conftest import build_tiny_engine

    root = tmp_path_factory.mktemp("eos")
    (root / "plain").mkdir()
    (root / "stop").mkdir()
    plain = build_tiny_engine(tiny_checkpoint, root / "plain")
    out = run_json(plain, "--mode", "ar")["token_ids"]
    stop_at = next(i for i in range(4, len(out)) if out[i] not in out[:i] and out[i] != 257)
    ckpt = shutil.copytree(tiny_checkpoint, root / "ckpt")
    gen = ckpt / "target" / "generation_config.json"
    data = json.loads(gen.read_text()) if gen.is_file() else {}
    data["eos_token_id"] = [257, out[stop_at]]
    gen.write_text(json.dumps(data))
    assert json.loads((ckpt / "target" / "config.json").read_text())["eos_token_id"] == 257
    return build_tiny_engine(ckpt, root / "stop"), out[: stop_at + 1]


def run_json(engine, *args):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--json", "--prompt", "Hello", "--max-new-tokens", "40",
                         *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("mode", [["--mode", "ar"], ["--lookup-tokens", "0"], ["--lookup-tokens", "4"]])
def test_generation_config_eos_stops_run(stop_token_engine, mode):
    engine, expected = stop_token_engine
    res = run_json(engine, *mode)
    assert res["token_ids"] == expected and res["metrics"]["stop_reason"] == "eos"


def test_bench_hf_baselines_stop_at_the_same_tokens(stop_token_engine):
    from eagle_trt.bench.methods import build_methods
    from eagle_trt.runtime.session import Session

    engine, expected = stop_token_engine
    session = Session.open(engine)
    assert expected[-1] in session.runner.eos_token_ids
    methods = build_methods(session, ["hf", "ar"])
    assert all(expected[-1] in m.eos for m in methods if m.name == "hf")
