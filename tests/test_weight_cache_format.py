"""The weight cache's own files and settings, without an engine: a layout reads back bit for bit and aligned, no byte
of it changes unnoticed, and the size cap is a size or an error."""

from __future__ import annotations

import pytest
import torch

from eagle_trt import private_cache
from eagle_trt.errors import InputError
from eagle_trt.models import weight_cache


@pytest.mark.parametrize("value", ["lots", "-5", "inf", "nan", "1e400GB", "-1GB"])
def test_a_cap_that_is_not_a_size_is_an_error(value, monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", value)
    with pytest.raises(InputError, match=f"EAGLE_TRT_WEIGHT_CACHE_MAX='{value}' is not a size"):
        private_cache.max_bytes()


def test_cap_values(monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "2GB")
    assert private_cache.max_bytes() == 2 * 10**9
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "0")
    assert private_cache.max_bytes() == 0
    monkeypatch.delenv("EAGLE_TRT_WEIGHT_CACHE_MAX")
    assert private_cache.max_bytes() == 16 * 2**30


def test_file_round_trip_keeps_bytes_and_alignment(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g).bfloat16(),
               "c": torch.arange(4), "d": torch.zeros(0)}
    path = weight_cache.layouts_dir() / ("target-" + "1" * 32 + ".etw")
    weight_cache.write(path, tensors, {"k": [1, 2]})
    got, meta = weight_cache.read(path)
    assert meta == {"k": [1, 2]}
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
        assert got[name].data_ptr() % weight_cache.ALIGN == 0 or t.numel() == 0
    assert weight_cache.read(path.with_name("target-" + "2" * 32 + ".etw")) is None


def test_no_byte_of_a_layout_changes_unnoticed(tmp_path, monkeypatch):
    # Found by the fuzz harness: the alignment padding between the header and the data was covered by neither the
    # MAC nor the checksum. Every byte position, flipped, must make the file a miss.
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    path = weight_cache.layouts_dir() / ("target-" + "3" * 32 + ".etw")
    weight_cache.write(path, {"a": torch.arange(12.0), "b": torch.ones(5, dtype=torch.bfloat16)}, {})
    good = path.read_bytes()
    for at in range(len(good)):
        bad = bytearray(good)
        bad[at] ^= 0x01
        path.write_bytes(bytes(bad))
        assert weight_cache.read(path) is None, at
    path.write_bytes(good)
    assert weight_cache.read(path) is not None
