"""The runtime weight cache (models/weight_cache.py, private_cache.py): an engine opened a second time maps the layout
the first open made, packs nothing, and decodes the same tokens; a rebuilt engine, another backend or a damaged file
never reads a stale layout; it removes only files it provably wrote, stores no layout made from unchecked bytes, and
detects a layout whose bytes changed."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct

import pytest
import torch
from typer.testing import CliRunner

from eagle_trt import private_cache
from eagle_trt.cli.app import app
from eagle_trt.errors import EngineIntegrityError
from eagle_trt.models import weight_cache
from eagle_trt.runtime.session import Session

PROMPT = "Hello there"


@pytest.fixture(autouse=True)
def settled_at_once(monkeypatch):
    """Files count as settled at once (not after verified.RACY_S seconds), so a test's fresh engine is proven."""
    from eagle_trt.engine import verified

    monkeypatch.setattr(verified, "RACY_S", 0.0)
    private_cache._warned.clear()


@pytest.fixture(params=["float32", "bfloat16"])
def engine(request, tiny_checkpoint, tmp_path, monkeypatch):
    """A tiny engine built with the cache in tmp_path/weights: `build` leaves its runtime layout there."""
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {tiny_checkpoint}\ndtype: {request.param}\nmax_input_len: 64\n"
                   "max_output_len: 64\n")
    r = CliRunner().invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "engine"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["runtime_layout"] in ("amx", "avx512", "avx2", "torch")
    return tmp_path / "engine"


def layouts(tmp_path, role="*"):
    return sorted((tmp_path / "weights" / private_cache.SUBDIR / "layouts").glob(f"{role}-*.etw"))


def tokens(session, **opts):
    ids = session.encode(PROMPT)
    return session.runner.generate(ids, session.decode_config(max_new_tokens=20, **opts)).token_ids


def state(session) -> dict[str, torch.Tensor]:
    """Every tensor the target's forward reads, in its runtime layout."""
    return session.runner.target.runtime_state()[0]


def same_weights(a, b) -> bool:
    sa, sb = state(a), state(b)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def no_packing(monkeypatch):
    """Make reading the engine's checkpoint layout or packing a weight fail: a cache hit does neither."""
    import eagle_trt.models.llama as llama
    from eagle_trt.models.native import gemm

    def fail(*a, **k):
        raise AssertionError("the layout was made again")

    monkeypatch.setattr(llama, "LazyTensors", fail)
    monkeypatch.setattr(gemm.NativeProjection, "__init__", fail)


def reference(engine, monkeypatch):
    """The engine opened with the cache off: its layout made from its own (verified) weights."""
    with monkeypatch.context() as m:
        m.setenv("EAGLE_TRT_WEIGHT_CACHE", "0")
        return Session.open(engine)


def damage(file, offset: int, nbytes: int, byte: int = 0x7F) -> None:
    """Overwrite bytes inside a file, keeping its size and mtime (what `dd conv=notrunc` + `touch -r` leave)."""
    st = file.stat()
    with open(file, "r+b") as f:
        f.seek(offset)
        f.write(bytes([byte]) * nbytes)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_build_leaves_the_layout_and_run_maps_it(engine, tmp_path, monkeypatch):
    assert [p.name.split("-")[0] for p in layouts(tmp_path)] == ["draft", "target"]
    fresh = reference(engine, monkeypatch)
    ar, sd = tokens(fresh, mode="ar"), tokens(fresh)
    no_packing(monkeypatch)
    mapped = Session.open(engine)
    assert tokens(mapped, mode="ar") == ar and tokens(mapped) == sd
    assert mapped.runner.target.kernels.name == fresh.runner.target.kernels.name
    assert same_weights(mapped, fresh)


def test_the_cache_dir_is_private_and_only_its_subdir_is_written(engine, tmp_path):
    home = tmp_path / "weights" / private_cache.SUBDIR
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == [private_cache.SUBDIR]
    for d in (home, home / "layouts", home / "records"):
        assert d.stat().st_mode & 0o777 == 0o700
    assert (home / "key").stat().st_mode & 0o777 == 0o600
    assert all(p.stat().st_mode & 0o077 == 0 for p in layouts(tmp_path))


# ---- 1. pruning removes only what the cache wrote ------------------------------------------------------------------

def test_pruning_never_removes_files_the_cache_did_not_write(tiny_checkpoint, tmp_path, monkeypatch):
    """The reported data loss: a cache pointed at a model dir deleted its 17 GB pytorch_model.bin (over the default
    cap, oldest first) and, under a small cap, a 1 MB adapter.bin. Nothing outside the cache's own subdir is touched,
    nor anything inside it that is not provably one of its layouts."""
    from conftest import build_tiny_engine

    user = tmp_path / "m"
    user.mkdir()
    big = user / "pytorch_model.bin"
    with open(big, "wb") as f:
        f.truncate(17 * 2**30)  # sparse: 17 GiB over the default cap, no disk used
    (user / "adapter.bin").write_bytes(os.urandom(1 << 20))
    for f in user.iterdir():
        os.utime(f, (1577836800, 1577836800))  # 2020-01-01: the oldest files there
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(user))
    engine = build_tiny_engine(tiny_checkpoint, tmp_path)
    lay = user / private_cache.SUBDIR / "layouts"
    # Inside the cache's own dir: a file with a layout's name but not its magic, and one with the magic and
    # another name. Neither is provably a layout of this cache.
    impostor = lay / ("target-" + "0" * 32 + ".etw")
    impostor.write_bytes(b"user data" * 100)
    other = lay / "notes.etw"
    other.write_bytes(weight_cache.MAGIC + b"x" * 100)
    for f in (impostor, other):
        os.utime(f, (1577836800, 1577836800))
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "1")  # every layout but the one written is over the cap
    for f in lay.glob("*-*.etw"):
        if f != impostor:
            f.unlink()
    Session.open(engine)  # makes and stores its layouts: each write prunes
    assert len(list(lay.glob("*-*.etw"))) == 2  # the impostor and the last layout written
    assert big.stat().st_size == 17 * 2**30 and (user / "adapter.bin").stat().st_size == 1 << 20
    assert impostor.read_bytes() == b"user data" * 100 and other.is_file()
    r = CliRunner().invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--max-new-tokens", "4"])
    assert r.exit_code == 0, r.output
    assert big.is_file() and (user / "adapter.bin").is_file() and impostor.is_file() and other.is_file()


def _layout(root, name, owner, nbytes, age):
    """A layout file of about nbytes whose engine dir is `owner`, last used `age` seconds ago."""
    import time

    path = root / f"target-{name}.etw"
    src = private_cache.WeightSource(owner, {"model.safetensors": name}, owner=owner)
    weight_cache.write(path, {"w": torch.zeros(nbytes // 4)}, {}, source=src)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_layouts_of_deleted_engines_go_and_the_cache_keeps_under_its_cap(tmp_path, monkeypatch):
    """The cache does not grow without bound: a write removes the layouts whose engine dir is gone, then the least
    recently used until the rest fit the cap; the file just written stays even alone over the cap."""
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "100MB")  # no pruning while the files are laid out
    root = weight_cache.layouts_dir()
    engines = [tmp_path / f"engine{i}" for i in range(5)]
    for e in engines:
        e.mkdir()
    old = _layout(root, "a" * 32, engines[0], 4000, age=300)
    mid = _layout(root, "b" * 32, engines[1], 4000, age=200)
    new = _layout(root, "c" * 32, engines[2], 4000, age=100)
    gone = _layout(root, "d" * 32, tmp_path / "deleted", 400, age=50)
    assert weight_cache.read(old) is not None  # a read makes `old` the most recently used
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "10000")  # two layouts of 4000 bytes and their headers
    kept = _layout(root, "e" * 32, engines[3], 4000, age=0)
    assert sorted(p.name[7] for p in root.glob("*.etw")) == ["a", "e"]  # `gone` (no engine), then mid, then new
    assert kept.is_file() and not gone.exists() and not mid.exists() and not new.exists()
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "10")
    _layout(root, "f" * 32, engines[4], 4000, age=0)
    assert [p.name[7] for p in root.glob("*.etw")] == ["f"]


def test_a_rebuild_replaces_its_old_layout(engine, tmp_path):
    """Rebuilding an engine in place leaves one layout per role in the cache, not one per build."""
    before = layouts(tmp_path)
    cfg = (tmp_path / "cfg.yaml").read_text()
    (tmp_path / "cfg.yaml").write_text(cfg.replace("max_output_len: 64", "max_output_len: 32"))  # new files
    r = CliRunner().invoke(app, ["build", "-c", str(tmp_path / "cfg.yaml"), "-o", str(engine)])
    assert r.exit_code == 0, r.output
    after = layouts(tmp_path)
    assert len(after) == len(before) == 2


# ---- 2. no layout made from unchecked bytes is stored ---------------------------------------------------------------

def test_a_layout_made_under_skip_verify_is_not_served_to_verified_runs(engine, tmp_path, monkeypatch):
    """The reported case: a damaged weight file run with --skip-verify, then repaired (same mtime): the verified
    runs after it must compute the repaired model, not the damaged one."""
    weights = engine / "target" / "model.safetensors"
    good = weights.read_bytes()
    want = reference(engine, monkeypatch)
    for f in layouts(tmp_path):
        f.unlink()
    damage(weights, len(good) // 2, 4096)
    damaged = Session.open(engine, verify=False)
    assert not same_weights(damaged, want)
    assert layouts(tmp_path, "target") == []  # made in memory only
    st = weights.stat()
    weights.write_bytes(good)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    repaired = Session.open(engine)
    assert layouts(tmp_path, "target")  # these bytes were proven: stored
    assert same_weights(repaired, want) and tokens(repaired, mode="ar") == tokens(want, mode="ar")
    copy = tmp_path / "copy"
    shutil.copytree(engine, copy)  # `cp -a`: the same hashes, so the same (good) layout
    assert same_weights(Session.open(copy), want)


def test_a_file_changed_after_it_was_hashed_stores_no_layout(engine, tmp_path, monkeypatch):
    """Bytes are proven by hashing them; a write between the hash and the load (a race) voids the proof."""
    import eagle_trt.models.llama as llama

    for f in layouts(tmp_path):
        f.unlink()
    real = llama.LazyTensors

    def racing(model_dir, dtype):
        w = model_dir / "model.safetensors"
        damage(w, w.stat().st_size // 2, 64)
        return real(model_dir, dtype)

    monkeypatch.setattr(llama, "LazyTensors", racing)
    Session.open(engine)
    assert layouts(tmp_path, "target") == []


# ---- 3. the cache's own contents are checked --------------------------------------------------------------------

def test_a_layout_whose_bytes_changed_is_detected_and_made_again(engine, tmp_path, monkeypatch, caplog):
    want = reference(engine, monkeypatch)
    (path,) = layouts(tmp_path, "target")
    damage(path, path.stat().st_size // 2, 64 << 10 if path.stat().st_size > 256 << 10 else 256, byte=0x11)
    with caplog.at_level(logging.WARNING):
        got = Session.open(engine)
    assert "does not match its checksum" in caplog.text and str(path) in caplog.text
    assert same_weights(got, want)
    assert weight_cache.read(path) is not None  # made again, whole


def test_a_forged_hashed_record_does_not_skip_the_hash(engine, tmp_path):
    """A record claiming a tampered file was hashed (the current stamps, the manifest's hashes) but not signed with
    the cache's key is ignored: the file is hashed and refused."""
    from eagle_trt.engine import verified

    Session.open(engine)
    weights = engine / "target" / "model.safetensors"
    damage(weights, weights.stat().st_size // 2, 1, byte=0x00)
    manifest = json.loads((engine / "manifest.json").read_text())
    files = {str((engine / rel).resolve()): {"sha256": e["sha256"], "stamp": private_cache.stamp(engine / rel)}
             for rel, e in manifest["files"].items()}
    record = verified._path(engine, create=True)
    record.write_text(json.dumps({"engine": str(engine.resolve()), "files": files, "mac": "0" * 64}))
    with pytest.raises(EngineIntegrityError, match="does not match its sha256"):
        Session.open(engine)
    record.write_text(json.dumps({"engine": str(engine.resolve()), "files": files}))  # no mac at all
    with pytest.raises(EngineIntegrityError, match="does not match its sha256"):
        Session.open(engine)


@pytest.mark.parametrize("edit", ["huge header length", "shape edited", "cut short", "unsigned", "not ours"])
def test_a_bad_layout_is_a_miss_not_an_error(engine, tmp_path, monkeypatch, caplog, edit):
    """Each damage the reports found (a header length of 2^62, a shape edited [576] -> [575], a file cut short)
    and a header re-signed by someone without the key: a warning naming the file, the layout made again, the right
    weights."""
    want = reference(engine, monkeypatch)
    (path,) = layouts(tmp_path, "target")
    data = bytearray(path.read_bytes())
    n = struct.unpack("<Q", data[8:16])[0]
    header = json.loads(bytes(data[weight_cache._PREFIX:weight_cache._PREFIX + n]))
    if edit == "huge header length":
        data[8:16] = struct.pack("<Q", 2**62)
    elif edit == "shape edited":
        name, e = next((k, v) for k, v in header["tensors"].items() if len(v["shape"]) == 1 and v["shape"][0] > 1)
        e["shape"] = [e["shape"][0] - 1]
        raw = json.dumps(header).encode()
        tag = private_cache.mac(raw).encode()  # even signed with the key: the sizes no longer agree
        data = bytearray(weight_cache.MAGIC + struct.pack("<Q", len(raw)) + tag + raw) + data[weight_cache._PREFIX + n:]
    elif edit == "cut short":
        data = data[: len(data) - 100]
    elif edit == "unsigned":
        data[weight_cache._PREFIX - 64:weight_cache._PREFIX] = b"0" * 64
    else:
        data[:8] = b"NOTOURS!"
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        got = Session.open(engine)
    assert str(path) in caplog.text and "making it again" in caplog.text
    assert same_weights(got, want)
    assert weight_cache.read(path) is not None


def test_a_cache_dir_others_can_write_is_not_used(tiny_checkpoint, tmp_path, monkeypatch, caplog):
    from conftest import build_tiny_engine

    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    home = tmp_path / "weights" / private_cache.SUBDIR
    home.mkdir(parents=True)
    os.chmod(home, 0o777)
    private_cache._warned.clear()
    with caplog.at_level(logging.WARNING):
        engine = build_tiny_engine(tiny_checkpoint, tmp_path)
        Session.open(engine)
    assert "is writable by others (mode 0777)" in caplog.text and f"chmod 700 '{home}'" in caplog.text
    assert caplog.text.count("is writable by others") == 1  # said once
    assert list(home.iterdir()) == []  # nothing stored, nothing trusted
    os.chmod(home, 0o755)
    assert private_cache.home() is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a dir to another user needs root")
def test_a_cache_dir_owned_by_another_user_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    home = tmp_path / "weights" / private_cache.SUBDIR
    home.mkdir(parents=True, mode=0o700)
    os.chown(home, 12345, 12345)
    private_cache._warned.clear()
    assert private_cache.home() is None and private_cache.untrusted_dir(home).startswith("is owned by uid 12345")


def test_a_symlinked_cache_dir_is_not_used(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / private_cache.SUBDIR).symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", str(tmp_path / "weights"))
    assert private_cache.home() is None


# ---- settings ------------------------------------------------------------------------------------------------------

def test_a_bad_cap_fails_run_and_build_with_one_line(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "inf")
    r = CliRunner().invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--max-new-tokens", "2"])
    assert r.exit_code == 2 and "EAGLE_TRT_WEIGHT_CACHE_MAX='inf' is not a size" in r.output
    assert "Traceback" not in r.output
    r = CliRunner().invoke(app, ["build", "-c", str(tmp_path / "cfg.yaml"), "-o", str(tmp_path / "e2")])
    assert r.exit_code == 2 and "is not a size" in r.output and not (tmp_path / "e2").exists()


def test_cap_zero_keeps_no_layouts(engine, tmp_path, monkeypatch):
    assert layouts(tmp_path)
    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE_MAX", "0")
    for f in layouts(tmp_path, "target"):
        f.unlink()
    Session.open(engine)
    assert layouts(tmp_path) == []


def test_off_writes_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    from conftest import build_tiny_engine

    monkeypatch.setenv("EAGLE_TRT_WEIGHT_CACHE", "0")
    engine = build_tiny_engine(tiny_checkpoint, tmp_path)
    src = private_cache.WeightSource(engine / "target", {"model.safetensors": "x"})
    assert weight_cache.cache_path(src, "target", "k") is None
    Session.open(engine)
    assert not (tmp_path / "weights").exists()


