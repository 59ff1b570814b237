"""convert --features-from ENGINE: a built engine of the target computes the feature cache with its own kernels. Its
features are transformers' up to fp32 summation order (an fp32 engine), a head trains on them, the cache records
who computed it, and an engine of another model, or a dir that is no engine, is refused before any feature."""

import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model
from train_support import one_thread, write_chats  # noqa: F401
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.convert.attach import default_aux_layer_ids
from eagle_trt.convert.engine_features import EngineSource
from eagle_trt.convert.feature_cache import HFSource
from eagle_trt.convert.load_target import load_target
from eagle_trt.errors import InputError


def _engine(model_dir: Path, tmp: Path) -> Path:
    """An fp32 engine of `model_dir` (untrained head), through the CLI."""
    cli = CliRunner()
    r = cli.invoke(app, ["convert", str(model_dir), "--output", str(tmp / "ckpt"), "--no-calibrate-kv"])
    assert r.exit_code == 0, r.output
    cfg = tmp / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {tmp / 'ckpt'}\ndtype: float32\nmax_input_len: 256\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp / "engine")])
    assert r.exit_code == 0, r.output
    return tmp / "engine"


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    return _engine(tiny_model_dir, tmp_path_factory.mktemp("features-engine"))


def test_the_engines_features_are_transformers(engine, tiny_model_dir):
    model = load_target(tiny_model_dir)[0]
    aux = default_aux_layer_ids(model.config.num_hidden_layers)
    source = EngineSource.open(engine, model, aux)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, 250, (n,), generator=g).tolist() for n in (7, 40, 23)]
    ours, theirs = source.features(seqs), HFSource(model, aux).features(seqs)
    for q, (a, h, p), (ra, rh, rp) in zip(seqs, ours, theirs):
        assert a.shape == ra.shape == (len(q), len(aux) * model.config.hidden_size) and h.shape == rh.shape
        torch.testing.assert_close(a.float(), ra.float(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(h.float(), rh.float(), rtol=1e-4, atol=1e-4)
        assert (p == rp).float().mean() >= 0.9
    # Rows never see another sequence: a sequence alone gives its features in a batch bit for bit.
    alone = source.features([seqs[1]])[0]
    assert all(torch.equal(x, y) for x, y in zip(alone, ours[1]))


def test_a_head_trains_on_engine_features(engine, tiny_model_dir, tmp_path):
    from eagle_trt.convert import convert_model

    chats = write_chats(tmp_path / "chats.jsonl", [12, 20, 8, 30, 16, 10])
    work = tmp_path / "work"
    convert_model(tiny_model_dir, tmp_path / "ck", steps=3, draft_vocab_size=64, data=[chats], seq_len=48,
                  batch_size=4, progress=False, validate=False, calibrate_kv=False, features_from=engine,
                  work_dir=work)
    meta = json.loads((work / "cache" / "meta.json").read_text())
    assert meta["computed_by"] == "engine" and meta["tokens"] > 0
    training = json.loads((tmp_path / "ck" / "convert.json").read_text())["training"]
    assert training["steps"] == 3 and torch.isfinite(torch.tensor(training["loss_last20"]))


def test_an_engine_of_another_model_is_refused(tiny_model_dir, tmp_path):
    other = _engine(make_tiny_model(tmp_path / "other", seed=5), tmp_path)
    model = load_target(tiny_model_dir)[0]
    with pytest.raises(InputError, match="probe positions .* another model"):
        EngineSource.open(other, model, default_aux_layer_ids(model.config.num_hidden_layers))
    with pytest.raises(InputError, match="not an engine dir"):
        EngineSource.open(tmp_path, model, [1])


def test_features_from_is_checked_before_the_model_loads(tiny_model_dir, tmp_path):
    from eagle_trt.convert import convert_model

    for bad in (dict(features_from=tmp_path, steps=1, data=["x.jsonl"]), dict(features_from=tmp_path)):
        with pytest.raises(InputError, match="--features-from"):
            convert_model(tiny_model_dir, tmp_path / "ck", progress=False, **bad)
    assert not (tmp_path / "ck").exists()
