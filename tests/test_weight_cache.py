"""The runtime weight cache (models/weight_cache.py): an engine opened a second time maps the layout the first open
made, packs nothing, and decodes the same tokens; a rebuilt engine, another backend or a damaged file never reads a
stale layout."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_trt.models import weight_cache
from eagle_trt.runtime.session import Session

PROMPT = "Hello there"


@pytest.fixture(params=["float32", "bfloat16"])
def engine(request, tiny_checkpoint, tmp_path, monkeypatch):
    """A tiny engine built with the cache in tmp_path/weights: `build` leaves its runtime layout there."""
    from typer.testing import CliRunner

    from eagle_trt.cli.app import app

    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {tiny_checkpoint}\ndtype: {request.param}\nmax_input_len: 64\n"
                   "max_output_len: 64\n")
    r = CliRunner().invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "engine"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["runtime_layout"] in ("amx", "avx512", "avx2", "torch")
    return tmp_path / "engine"


def tokens(session, **opts):
    ids = session.encode(PROMPT)
    return session.runner.generate(ids, session.decode_options(max_new_tokens=20, **opts)).token_ids


def no_packing(monkeypatch):
    """Make reading the engine's checkpoint layout or packing a weight fail: a cache hit does neither."""
    import eagle_trt.models.llama as llama
    from eagle_trt.models.native import gemm

    def fail(*a, **k):
        raise AssertionError("the layout was made again")

    monkeypatch.setattr(llama, "LazyTensors", fail)
    monkeypatch.setattr(gemm.NativeProjection, "__init__", fail)


def test_build_leaves_the_layout_and_run_maps_it(engine, tmp_path, monkeypatch):
    files = sorted(p.name.split("-")[0] for p in (tmp_path / "weights").glob("*.bin"))
    assert files == ["draft", "target"]
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", "0")
    fresh = Session.open(engine)  # made from the engine's own weights
    ar, sd = tokens(fresh, mode="ar"), tokens(fresh)
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    no_packing(monkeypatch)
    mapped = Session.open(engine)
    assert tokens(mapped, mode="ar") == ar and tokens(mapped) == sd
    assert mapped.runner.target.backend.name == fresh.runner.target.backend.name


def test_a_rebuilt_engine_or_a_damaged_file_is_made_again(engine, tmp_path):
    target_file = next((tmp_path / "weights").glob("target-*.bin"))
    target_file.write_bytes(target_file.read_bytes()[:100])  # damaged: cut short
    assert tokens(Session.open(engine), mode="ar")
    assert target_file.stat().st_size > 100  # made again, in place
    manifest = engine / "manifest.json"
    data = json.loads(manifest.read_text())
    data["files"]["target/model.safetensors"]["sha256"] = "0" * 64  # what a rebuild with new weights changes
    manifest.write_text(json.dumps(data))
    Session.open(engine, verify=False)
    layouts = list((tmp_path / "weights").glob("target-*.bin"))
    assert len(layouts) == 1 and layouts[0] != target_file  # a new layout, and the stale one gone


def test_off_writes_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    from conftest import build_tiny_engine

    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", "0")
    engine = build_tiny_engine(tiny_checkpoint, tmp_path)
    assert weight_cache.cache_path(engine / "target", "target", "k") is None
    Session.open(engine)
    assert not (tmp_path / "weights").exists()


def test_file_round_trip_keeps_bytes_and_alignment(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g).bfloat16(),
               "c": torch.arange(4), "d": torch.zeros(0)}
    weight_cache.write(tmp_path / "x.bin", tensors, {"k": [1, 2]})
    got, meta = weight_cache.read(tmp_path / "x.bin")
    assert meta == {"k": [1, 2]}
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
        assert got[name].data_ptr() % weight_cache.ALIGN == 0 or t.numel() == 0
    assert weight_cache.read(tmp_path / "missing.bin") is None


def test_a_rebuild_replaces_its_old_layout(engine, tmp_path):
    """Rebuilding an engine in place leaves one layout per role in the cache, not one per build."""
    from typer.testing import CliRunner

    from eagle_trt.cli.app import app

    before = sorted(p.name for p in (tmp_path / "weights").glob("*.bin"))
    r = CliRunner().invoke(app, ["build", "-c", str(tmp_path / "cfg.yaml"), "-o", str(engine)])
    assert r.exit_code == 0, r.output
    after = sorted(p.name for p in (tmp_path / "weights").glob("*.bin"))
    assert len(after) == len(before) == 2 and after != before  # new files (new mtimes), the old ones gone


def _layout(root, name, source, nbytes, age):
    """A cache file of about nbytes made from `source`, last used `age` seconds ago."""
    import os
    import time

    path = root / f"target-{name}.bin"
    weight_cache.write(path, {"w": torch.zeros(nbytes // 4)}, {}, source=source)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_layouts_of_deleted_engines_go_and_the_cache_keeps_under_its_cap(tmp_path, monkeypatch):
    """The cache does not grow without bound: a write removes the layouts whose engine dir is gone, then the least
    recently used until the rest fit the cap; the file just written stays even alone over the cap."""
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "100MB")  # no pruning while the files are laid out
    root = tmp_path / "weights"
    engines = [tmp_path / f"engine{i}" for i in range(4)]
    for e in engines:
        e.mkdir()
    old = _layout(root, "a" * 24, engines[0], 4000, age=300)
    mid = _layout(root, "b" * 24, engines[1], 4000, age=200)
    new = _layout(root, "c" * 24, engines[2], 4000, age=100)
    gone = _layout(root, "d" * 24, tmp_path / "deleted", 400, age=50)
    assert weight_cache.read(old) is not None  # a read makes `old` the most recently used
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "9000")
    kept = _layout(root, "e" * 24, engines[3], 4000, age=0)
    assert sorted(p.name[7] for p in root.glob("*.bin")) == ["a", "e"]  # `gone` (no engine), then mid, then new
    assert kept.is_file() and not gone.exists() and not mid.exists() and not new.exists()
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "10")
    _layout(root, "f" * 24, engines[0], 4000, age=0)
    assert [p.name[7] for p in root.glob("*.bin")] == ["f"]


def test_a_cap_that_is_not_a_size_falls_back_to_the_default(monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "lots")
    assert weight_cache.max_bytes() == 16 * 2**30
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "2GB")
    assert weight_cache.max_bytes() == 2 * 10**9
