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
    for bad in ("", "abc", "-5GB", "0", "inf", "infGB", "nan", "1e400", "-inf"):
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


def _split_checkpoint(tiny_checkpoint, tmp_path):
    """A copy of the tiny checkpoint whose target is two shards + index (embeddings in shard 1)."""
    import shutil

    ckpt = tmp_path / "C"
    shutil.copytree(tiny_checkpoint, ckpt)
    target = ckpt / "target"
    w = load_file(str(target / "model.safetensors"))
    (target / "model.safetensors").unlink()
    names = sorted(w)
    first = [n for n in names if "embed" in n or n < "model.layers.2"]
    second = [n for n in names if n not in first]
    save_file({n: w[n] for n in first}, str(target / "model-00001-of-00002.safetensors"))
    save_file({n: w[n] for n in second}, str(target / "model-00002-of-00002.safetensors"))
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in second})
    (target / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return ckpt, w, second


def _build(ckpt, tmp_path, *extra):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {ckpt}\nmax_input_len: 64\nmax_output_len: 64\n")
    return cli.invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "E"), *extra])


def test_a_tensor_in_two_shards_is_refused(tiny_checkpoint, tmp_path):
    """The reported silent wrong result: shard 2 also holds an all-zero model.embed_tokens.weight that the index maps
    to shard 1; the engine got zero embeddings and `run` printed ''. Refused at build (and --dry-run), naming both
    files."""
    ckpt, w, second = _split_checkpoint(tiny_checkpoint, tmp_path)
    assert _build(ckpt, tmp_path, "--dry-run").exit_code == 0  # the split itself is fine
    shard2 = ckpt / "target" / "model-00002-of-00002.safetensors"
    save_file({**{n: w[n] for n in second}, "model.embed_tokens.weight": torch.zeros_like(w["model.embed_tokens.weight"])},
              str(shard2))
    for extra in (["--dry-run"], []):
        r = _build(ckpt, tmp_path, *extra)
        assert r.exit_code == 2, r.output
        assert "tensor 'model.embed_tokens.weight' is in both" in r.stderr and "model-00001-of-00002" in r.stderr
        assert "model-00002-of-00002" in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "E").exists()


def test_a_tensor_where_the_index_does_not_map_it_is_refused(tiny_checkpoint, tmp_path):
    ckpt, w, second = _split_checkpoint(tiny_checkpoint, tmp_path)
    index = ckpt / "target" / INDEX_NAME
    data = json.loads(index.read_text())
    data["weight_map"][second[0]] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(data))
    r = _build(ckpt, tmp_path, "--dry-run")
    assert r.exit_code == 2 and f"tensor '{second[0]}' is in" in r.stderr and "maps it to" in r.stderr, r.output


def test_convert_refuses_a_tensor_in_two_shards(tiny_model_dir, tmp_path):
    import shutil

    src = tmp_path / "hf"
    shutil.copytree(tiny_model_dir, src)
    w = load_file(str(src / "model.safetensors"))
    (src / "model.safetensors").unlink()
    names = sorted(w)
    save_file({n: w[n] for n in names[: len(names) // 2]}, str(src / "model-00001-of-00002.safetensors"))
    save_file({n: w[n] for n in names[len(names) // 2 - 1:]}, str(src / "model-00002-of-00002.safetensors"))
    wm = {n: "model-00001-of-00002.safetensors" for n in names[: len(names) // 2]}
    wm.update({n: "model-00002-of-00002.safetensors" for n in names[len(names) // 2:]})
    (src / INDEX_NAME).write_text(json.dumps({"weight_map": wm}))
    r = cli.invoke(app, ["convert", str(src), "--output", str(tmp_path / "out")])
    dup = names[len(names) // 2 - 1]
    assert r.exit_code == 2 and f"tensor '{dup}' is in both" in r.stderr, r.output
    assert not (tmp_path / "out").exists()


def test_max_shard_size_inf_is_a_clear_error(tiny_checkpoint, tmp_path):
    r = _build(tiny_checkpoint, tmp_path, "--max-shard-size", "infGB")
    assert r.exit_code == 2 and "--max-shard-size: not a size: 'infGB'" in r.stderr and "Overflow" not in r.output
