"""Opening an engine: the manifest's hashes and sizes checked, every integrity error named, files hashed once per
write. Tiny model, CPU, fast."""

from __future__ import annotations

import pytest

from eagle_trt.engine import open_engine
from eagle_trt.errors import CheckpointError, EngineIntegrityError
from engine_support import AUX, base_ckpt, cfg, ckpt, engine  # noqa: F401  (fixtures)


def test_open_engine(engine):
    eng = open_engine(engine)
    assert eng.root == engine and eng.config.name == "tiny" and eng.manifest.draft.aux_layer_ids == AUX
    assert (eng.target_dir / "model.safetensors").is_file() and (eng.draft_dir / "config.json").is_file()
    assert (eng.tokenizer_dir / "tokenizer.json").is_file()


def test_tampered_byte(engine):
    path = engine / "draft" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    open_engine(engine, verify=False)  # same size: only hashing can tell
    with pytest.raises(EngineIntegrityError, match=rf"^engine file '{path}' does not match its sha256 in manifest.json \("):
        open_engine(engine)


def test_truncated_file(engine):
    path = engine / "target" / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(EngineIntegrityError) as info:
        open_engine(engine, verify=False)
    assert str(info.value) == f"engine file '{path}' has 1000 bytes, manifest.json says {size} (truncated or replaced)"


def test_missing_manifest(engine):
    (engine / "manifest.json").unlink()
    with pytest.raises(EngineIntegrityError) as info:
        open_engine(engine, verify=False)
    assert str(info.value) == (
        f"'{engine / 'manifest.json'}' not found: '{engine}' is not an engine dir or its build did not finish"
    )


def test_unparseable_manifest(engine):
    (engine / "manifest.json").write_text("{not json")
    with pytest.raises(EngineIntegrityError, match=r"manifest.json' is not valid JSON: "):
        open_engine(engine)


def test_deleted_file(engine):
    (engine / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(EngineIntegrityError) as info:
        open_engine(engine)
    assert str(info.value) == f"engine file '{engine / 'tokenizer' / 'tokenizer.json'}' is missing (listed in manifest.json)"


def test_extra_weight_file(engine):
    (engine / "draft" / "extra.safetensors").write_bytes(b"x")
    with pytest.raises(EngineIntegrityError) as info:
        open_engine(engine)
    assert str(info.value) == f"engine dir '{engine}' has a weight file not in manifest.json: 'draft/extra.safetensors'"


def test_missing_engine_dir(tmp_path):
    with pytest.raises(CheckpointError, match=r"^engine dir '.*nope' not found$"):
        open_engine(tmp_path / "nope")


def test_a_file_hashed_before_is_not_hashed_again_until_written(engine, monkeypatch, tmp_path):
    """open_engine re-hashes only files written since this machine last hashed them; inspect always hashes."""
    import os
    import time

    import eagle_trt.engine.engine_dir as engine_dir
    from eagle_trt.engine import verified

    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(verified, "RACY_S", 0.0)
    hashed = []
    real = engine_dir.sha256_file
    monkeypatch.setattr(engine_dir, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    open_engine(engine)
    first = len(hashed)
    assert first > 3
    open_engine(engine)
    assert len(hashed) == first  # nothing hashed the second time
    weights = engine / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    st = weights.stat()
    time.sleep(0.01)
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only ctime tells
    with pytest.raises(EngineIntegrityError, match="modified after the build"):
        open_engine(engine)
    open_engine(engine, verify=False)
    hashed.clear()
    with pytest.raises(EngineIntegrityError):
        open_engine(engine, rehash=True)
