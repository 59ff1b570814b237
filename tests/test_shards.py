"""Sharded weights in and out: the streamed safetensors reader/writer against the safetensors library, and a tiny
checkpoint split into many shards going through convert, build and run with the same tokens as unsharded."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.safetensors_stream import Planned, parse_size, plan_shards, read_entries, read_tensor, write_sharded
from eagle_trt.shards import INDEX_NAME

cli = CliRunner()


def tensors():
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(7, 5, generator=g), "b.bf16": torch.randn(3, 4, generator=g).bfloat16(),
            "c.ids": torch.arange(6, dtype=torch.int64), "d.mask": torch.tensor([True, False, True]),
            "e.scalar": torch.tensor(2.5), "f.empty": torch.zeros(0, 4), "g.fp8": torch.randn(4).to(torch.float8_e4m3fn)}


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def test_reader_matches_the_library(tmp_path):
    ref = tensors()
    save_file(ref, str(tmp_path / "x.safetensors"))
    entries = read_entries(tmp_path / "x.safetensors")
    assert set(entries) == set(ref)
    with open(tmp_path / "x.safetensors", "rb") as f:
        for name, e in entries.items():
            t = read_tensor(f, e)
            assert t.dtype == ref[name].dtype and torch.equal(raw(t), raw(ref[name]))


@pytest.mark.parametrize("limit", [10**9, 64])
def test_writer_output_is_what_the_library_reads(tmp_path, limit):
    ref = tensors()
    plan = [Planned(k, v.dtype, tuple(v.shape)) for k, v in sorted(ref.items())]
    paths = write_sharded(tmp_path, plan, lambda n: ref[n], limit, metadata={"format": "pt"})
    got = {}
    for p in paths:
        got.update(load_file(str(p)))
        assert p.stat().st_mode & 0o777 == 0o644
    assert set(got) == set(ref)
    assert all(torch.equal(raw(got[k]), raw(ref[k])) for k in ref)
    if limit == 64:
        assert len(paths) > 2 and paths[0].name == f"model-00001-of-{len(paths):05d}.safetensors"
        index = json.loads((tmp_path / INDEX_NAME).read_text())
        assert set(index["weight_map"]) == set(ref) and index["metadata"]["total_size"] == sum(p.nbytes for p in plan)
    else:
        assert [p.name for p in paths] == ["model.safetensors"] and not (tmp_path / INDEX_NAME).exists()


def test_sizes_and_grouping():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 << 30 and parse_size("500MB") == 500 * 10**6
    assert parse_size("1024") == 1024 and parse_size(7) == 7
    for bad in ("", "abc", "-5GB", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)
    plan = [Planned(str(i), torch.float32, (n,)) for i, n in enumerate([10, 10, 30, 5])]
    assert [[p.name for p in g] for g in plan_shards(plan, 80)] == [["0", "1"], ["2"], ["3"]]  # 30*4 > 80: alone


def test_a_sharded_checkpoint_builds_and_runs_like_one_file(tiny_checkpoint, tmp_path):
    """Convert writes a sharded target, build writes a sharded engine, run reads it: same tokens."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {tiny_checkpoint}\nmax_input_len: 64\nmax_output_len: 64\n")
    one = cli.invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "one")])
    many = cli.invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "many"), "--max-shard-size", "100KB"])
    assert one.exit_code == 0 and many.exit_code == 0, many.output
    shards = sorted(p.name for p in (tmp_path / "many" / "target").glob("model-*.safetensors"))
    assert len(shards) > 3 and (tmp_path / "many" / "target" / INDEX_NAME).is_file()
    assert not (tmp_path / "many" / "target" / "model.safetensors").exists()

    def tokens(engine):
        r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "Hello", "--max-new-tokens", "12", "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["token_ids"]

    assert tokens(tmp_path / "many") == tokens(tmp_path / "one")
    bad = cli.invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "x"), "--max-shard-size", "lots"])
    assert bad.exit_code == 2 and "--max-shard-size: not a size: 'lots'" in bad.stderr


def test_convert_writes_a_sharded_target_that_builds_and_runs(tiny_model_dir, tmp_path):
    r = cli.invoke(app, ["convert", str(tiny_model_dir), "--output", str(tmp_path / "ckpt"), "--max-shard-size",
                         "100KB", "--json"])
    assert r.exit_code == 0, r.output
    target = tmp_path / "ckpt" / "target"
    assert len(list(target.glob("model-*-of-*.safetensors"))) > 3 and (target / INDEX_NAME).is_file()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {tmp_path / 'ckpt'}\nmax_input_len: 64\nmax_output_len: 64\n")
    assert cli.invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "e")]).exit_code == 0
    r = cli.invoke(app, ["run", "--engine", str(tmp_path / "e"), "--prompt", "Hi", "--max-new-tokens", "6", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout)["token_ids"]) == 6, r.output
