"""`convert` refuses what would destroy its input, and finds bad arguments before any slow work (no work dir, no
staged output left behind)."""

import shutil

import pytest
from typer.testing import CliRunner

from eagle_trt.cli.app import app

cli = CliRunner()


def convert(*args):
    return cli.invoke(app, ["convert", *map(str, args)])


@pytest.fixture
def model(tiny_model_dir, tmp_path):
    """A private copy: these tests try to make convert delete it."""
    return shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")


@pytest.mark.parametrize("where, words", [
    (lambda m: m, "is the model being converted"),
    (lambda m: m.parent, "holds the model being converted"),
    (lambda m: m / "ckpt", "lies inside the model being converted"),
])
def test_output_overlapping_the_model_is_refused_even_with_force(model, where, words):
    before = sorted(p.name for p in model.iterdir())
    r = convert(model, "--output", where(model), "--force")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: --output ") and words in r.stderr
    assert sorted(p.name for p in model.iterdir()) == before


def test_output_overlapping_the_shipped_head_is_refused(model, tmp_path):
    from conftest import write_random_head

    head = write_random_head(tmp_path / "out" / "heads" / "h")
    r = convert(model, "--output", tmp_path / "out", "--head", head, "--force")
    assert r.exit_code == 2 and "holds the --head being shipped" in r.stderr
    assert (head / "model.safetensors").is_file()


def test_draft_vocab_larger_than_the_target_is_refused_before_the_data(model, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hello there"}\n')
    r = convert(model, "--output", tmp_path / "ckpt", "--steps", "2", "--data", data, "--draft-vocab-size", "100000")
    assert r.exit_code == 2 and "--draft-vocab-size 100000 exceeds the target's vocabulary (260)" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "models"]  # no .ckpt.train, no staged dir


@pytest.mark.parametrize("spec, message", [
    ("missing.jsonl", "--data file not found"),
    ("notes.csv", "unknown format .csv"),
])
def test_bad_data_is_refused_before_the_model_loads(model, tmp_path, monkeypatch, spec, message):
    (tmp_path / "notes.csv").write_text("a,b\n")
    import eagle_trt.convert.pipeline as pipeline

    monkeypatch.setattr(pipeline, "load_target", lambda *a, **k: pytest.fail("the model was loaded"))
    r = convert(model, "--output", tmp_path / "ckpt", "--steps", "2", "--data", tmp_path / spec)
    assert r.exit_code == 2 and message in r.stderr


def test_checkpoint_files_are_readable_by_others(tiny_checkpoint):
    modes = {p.relative_to(tiny_checkpoint).as_posix(): p.stat().st_mode & 0o777 for p in tiny_checkpoint.rglob("*")}
    assert modes["target/model.safetensors"] == 0o644
    assert all(m == (0o755 if (tiny_checkpoint / rel).is_dir() else 0o644) for rel, m in modes.items()), modes


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/model.safetensors", "..",
                                  "model.bin"])
def test_index_shard_names_must_stay_in_the_model_dir(model, tmp_path, name):
    import json

    (tmp_path / "models" / "outside.safetensors").write_bytes(b"")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": name}}))
    r = convert(model, "--output", tmp_path / "ckpt")
    assert r.exit_code == 2 and "which is not a file name in its dir" in r.stderr and repr(name) in r.stderr


def test_build_refuses_an_index_that_leaves_the_checkpoint(tiny_checkpoint, tmp_path):
    import json

    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    shutil.move(ckpt / "target" / "model.safetensors", tmp_path / "model-00001-of-00001.safetensors")
    (ckpt / "target" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.embed_tokens.weight": "../../model-00001-of-00001.safetensors"}}))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {ckpt}\nmax_input_len: 64\nmax_output_len: 64\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "engine")])
    assert r.exit_code == 2 and "'../../model-00001-of-00001.safetensors', which is not a file name" in r.stderr


def test_convert_without_modelopt_is_exit_3(model, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "modelopt" else real(name, *a))
    r = convert(model, "--output", tmp_path / "ckpt")
    assert r.exit_code == 3 and "NVIDIA modelopt, which is not installed" in r.stderr
    assert "pip install 'eagle-trt[convert]'" in r.stderr and not (tmp_path / "ckpt").exists()
