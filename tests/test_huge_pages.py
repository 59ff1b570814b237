"""Weights read from the runtime weight cache live in a huge-page arena (models/huge_pages.py): the arena is
zeroed, starts at a 2 MiB boundary, is owned by its views, and a layout read through it is the same tensors, bit
for bit, as one read through a file mapping (EAGLE_TRT_HUGE_PAGES=0)."""

from __future__ import annotations

import gc

import pytest
import torch

from eagle_trt import private_cache
from eagle_trt.errors import InputError
from eagle_trt.models import huge_pages, weight_cache


@pytest.fixture(autouse=True)
def not_preferred(monkeypatch):
    """Each test starts as a process no command asked for huge pages (`prefer` sets a process-wide choice)."""
    monkeypatch.setattr(huge_pages, "_preferred", False)
    monkeypatch.delenv("EAGLE_TRT_HUGE_PAGES", raising=False)


def test_long_running_commands_prefer_the_arena_and_the_variable_decides_for_all(monkeypatch):
    assert not huge_pages.enabled()
    huge_pages.prefer()
    assert huge_pages.enabled()
    monkeypatch.setenv("EAGLE_TRT_HUGE_PAGES", "0")
    assert not huge_pages.enabled()
    monkeypatch.setattr(huge_pages, "_preferred", False)
    monkeypatch.setenv("EAGLE_TRT_HUGE_PAGES", "1")
    assert huge_pages.enabled()
    monkeypatch.setenv("EAGLE_TRT_HUGE_PAGES", "yes")
    with pytest.raises(InputError, match="EAGLE_TRT_HUGE_PAGES='yes'"):
        huge_pages.enabled()


def test_an_arena_is_zeroed_aligned_and_its_size():
    for n in (0, 1, 4097, (2 << 20) + 3):
        a = huge_pages.arena(n)
        assert a.dtype == torch.uint8 and a.numel() == n
        assert a.data_ptr() % huge_pages.HUGE == 0
        assert not a.any()
        a.fill_(7)  # writable, every byte
        assert int(a.sum()) == 7 * n


def test_a_view_keeps_its_arena_alive():
    a = huge_pages.arena(3 << 20)
    a.fill_(5)
    tail = a[(2 << 20):]
    del a
    gc.collect()
    junk = [torch.full((1 << 20,), 9, dtype=torch.uint8) for _ in range(8)]  # would reuse the arena, were it freed
    assert bool((tail == 5).all()) and len(junk) == 8


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """A layout file of mixed dtypes and odd sizes (offsets not multiples of their dtype's width before padding)."""
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "cache"))
    root = weight_cache.layouts_dir()
    g = torch.Generator().manual_seed(3)
    tensors = {"a": torch.randn(5, 7, generator=g).to(torch.bfloat16), "b": torch.randint(0, 255, (13,),
               generator=g, dtype=torch.uint8), "c": torch.randn(3, 1, 9, generator=g), "empty": torch.empty(0, 4),
               "mask": torch.rand(6, generator=g) > 0.5, "i": torch.arange(11, dtype=torch.int32)}
    path = root / "target-0123456789abcdef0123456789abcdef.etw"
    weight_cache.write(path, tensors, {"k": 1})
    assert path.is_file()
    return path, tensors


@pytest.mark.parametrize("huge", ["1", "0"])
def test_a_layout_reads_the_same_in_an_arena_or_a_mapping(stored, monkeypatch, huge):
    monkeypatch.setenv("EAGLE_TRT_HUGE_PAGES", huge)
    path, want = stored
    got, meta = weight_cache.read(path)
    assert meta == {"k": 1} and got.keys() == want.keys()
    for k, t in want.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t), k
    if huge == "1":  # copied out: the file's later changes do not reach the tensors
        before = got["c"].clone()
        with open(path, "r+b") as f:
            f.seek(-8, 2)
            f.write(b"\xff" * 8)
        assert torch.equal(got["c"], before)


def test_a_file_shorter_than_its_data_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_HUGE_PAGES", "1")
    f = tmp_path / "short.bin"
    f.write_bytes(bytes(range(200)))
    with open(f, "rb") as fh:
        data = weight_cache._load_data(fh, 8, 192)
        assert data.data_ptr() % huge_pages.HUGE == 0 and bytes(data.numpy()) == bytes(range(8, 200))
        with pytest.raises(OSError, match="bytes early"):
            weight_cache._load_data(fh, 8, 300)


def test_a_layout_that_cannot_be_read_whole_is_a_miss_and_stays(stored, monkeypatch, caplog):
    path, _ = stored

    def failing_load(f, base, nbytes):
        raise OSError(f"{f.name} ended {nbytes} bytes early")

    monkeypatch.setattr(weight_cache, "_load_data", failing_load)
    private_cache._warned.clear()
    assert weight_cache.read(path) is None
    assert "cannot be read" in caplog.text and path.is_file()  # kept: the read failed, not the file


def test_a_bad_setting_fails_run_with_one_line(tiny_checkpoint, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from eagle_trt.cli.app import app

    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "cache"))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {tiny_checkpoint}\nmax_input_len: 64\nmax_output_len: 64\n")
    assert CliRunner().invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "e")]).exit_code == 0
    monkeypatch.setenv("EAGLE_TRT_HUGE_PAGES", "on")
    r = CliRunner().invoke(app, ["run", "--engine", str(tmp_path / "e"), "--prompt", "hi", "--max-new-tokens", "2"])
    assert r.exit_code != 0 and "EAGLE_TRT_HUGE_PAGES='on'" in r.output and "Traceback" not in r.output
    monkeypatch.setenv("EAGLE_TRT_HUGE_PAGES", "1")  # the arena: the same tokens as the mapping
    a = CliRunner().invoke(app, ["run", "--engine", str(tmp_path / "e"), "--prompt", "hi", "--max-new-tokens", "6",
                                 "--json"])
    monkeypatch.setenv("EAGLE_TRT_HUGE_PAGES", "0")
    b = CliRunner().invoke(app, ["run", "--engine", str(tmp_path / "e"), "--prompt", "hi", "--max-new-tokens", "6",
                                 "--json"])
    assert a.exit_code == 0 and b.exit_code == 0
    import json

    assert json.loads(a.stdout)["token_ids"] == json.loads(b.stdout)["token_ids"]
