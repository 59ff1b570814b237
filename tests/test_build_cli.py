"""`eagle-trt build` / `inspect` / `run` as a CI job sees them: exit codes, --json, --dry-run, determinism, tampering.

Everything goes through typer's CliRunner on eagle_trt.cli.app:app with a tiny fake checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from conftest import write_random_head
from eagle_trt.cli.app import app

RUNNER = CliRunner()
CFG = dict(name="tiny", dtype="float32", max_input_len=512, max_output_len=256, draft_length=4, total_tokens=16, beam_width=4)


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "ckpt"
    shutil.copytree(tiny_model_dir, root / "target")
    write_random_head(root / "draft")
    return root


def config(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**CFG, **changes}))
    return path


def build(tmp_path, ckpt, out="e", *extra, **changes):
    args = ["build", "-c", str(config(tmp_path, **changes)), "--checkpoint", str(ckpt), "-o", str(tmp_path / out)]
    return RUNNER.invoke(app, args + list(extra))


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def test_json_summary(tmp_path, ckpt):
    result = build(tmp_path, ckpt, "e", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # exactly one JSON object on stdout
    assert data["engine_dir"] == str(tmp_path / "e") and data["backend"] == "torch" and data["head"] == "eagle3"
    assert (data["dtype"], data["kv_cache_dtype"]) == ("float32", "float32")
    assert data["seconds"] > 0 and data["validated"] is True and data["trtllm"] is None
    assert {"target/model.safetensors", "draft/model.safetensors", "eagle_config.yaml"} <= set(data["files"])
    for rel, info in data["files"].items():
        assert set(info) == {"bytes", "sha256"} and info["bytes"] == (tmp_path / "e" / rel).stat().st_size
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert manifest["files"] == data["files"]


def test_help_documents_exit_codes_and_options():
    result = RUNNER.invoke(app, ["build", "--help"], terminal_width=200)
    text = " ".join(result.stdout.split())
    assert result.exit_code == 0
    assert "Exit codes: 0 ok, 2 bad config or input, 3 missing dependency or hardware, 1 anything else." in text
    for option in ("--dry-run", "--json", "--backend", "--checkpoint", "--output"):
        assert option in text


def _touch(path: Path) -> Path:
    path.write_bytes(b"GGUF")
    return path


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda tmp, ck: ["-c", str(config(tmp, draft_lenght=4)), "--checkpoint", str(ck)], "draft_lenght: unknown field"),
        (lambda tmp, ck: ["-c", str(tmp / "nope.yaml"), "--checkpoint", str(ck)], "nope.yaml' not found"),
        (lambda tmp, ck: ["-c", str(config(tmp)), "--checkpoint", str(tmp / "none")], "none' not found"),
        (lambda tmp, ck: ["-c", str(config(tmp)), "--checkpoint", str(ck), "--backend", "vllm"],
         "--backend: backend: Input should be 'torch' or 'trtllm' (got 'vllm')"),
        (lambda tmp, ck: ["-c", str(config(tmp)), "--checkpoint", str(ck), "--backend", "trtllm"],
         "dtype float32 is not supported by backend trtllm (use float16 or bfloat16)"),
        (lambda tmp, ck: ["-c", str(config(tmp, dtype="float16", total_tokens=32, beam_width=4, draft_length=4)),
                          "--checkpoint", str(ck), "--backend", "trtllm"], "total_tokens (32) exceeds beam_width x draft_length"),
        (lambda tmp, ck: ["-c", str(config(tmp, max_input_len=4096)), "--checkpoint", str(ck)],
         "exceeds max_position_embeddings (1024)"),
        (lambda tmp, ck: ["-c", str(config(tmp)), "--checkpoint", str(_touch(tmp / "model.gguf"))],
         "is a GGUF model file, not a checkpoint dir"),
        (lambda tmp, ck: ["-c", str(config(tmp)), "--checkpoint", str(_touch(tmp / "model.gguf"))],
         "model.gguf --output DIR`, then build with --checkpoint DIR"),
        (lambda tmp, ck: ["-c", "/dev/null", "--checkpoint", str(ck)], "'/dev/null' is not a regular file"),
    ],
)  # fmt: skip
def test_bad_config_or_input_exits_2(tmp_path, ckpt, setup, message):
    result = RUNNER.invoke(app, ["build", *setup(tmp_path, ckpt), "-o", str(tmp_path / "e")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert not (tmp_path / "e").exists()


def test_mismatched_head_exits_2_and_names_files(tmp_path, ckpt):
    bad = Path(shutil.copytree(ckpt, tmp_path / "bad"))
    cfg = json.loads((bad / "draft" / "config.json").read_text())
    (bad / "draft" / "config.json").write_text(json.dumps({**cfg, "hidden_size": 32}))
    result = build(tmp_path, bad, "e", "--dry-run")
    assert result.exit_code == 2
    assert "draft hidden_size (32)" in result.stderr and "does not match the target hidden_size (64)" in result.stderr


def test_missing_dependency_exits_3(tmp_path, ckpt, monkeypatch):
    monkeypatch.delattr(torch, "float8_e4m3fn")
    result = build(tmp_path, ckpt, "e", kv_cache_dtype="fp8")
    assert result.exit_code == 3, result.output
    assert "kv_cache_dtype fp8 needs torch.float8_e4m3fn" in result.stderr


def cpu_without_gpu(monkeypatch, fast_bf16: bool) -> None:
    """A CPU-only machine whose bf16 engine is fast (compiled kernels or hardware bf16) or emulated."""
    import eagle_trt.models.kernels as backend

    monkeypatch.setattr(backend, "cpu_has_native_bf16", lambda: fast_bf16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_bf16_hardware_warns(tmp_path, ckpt, monkeypatch, native):
    cpu_without_gpu(monkeypatch, native)
    result = build(tmp_path, ckpt, "e", "--json", dtype="bfloat16")
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    if native:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "no AMX or AVX512-BF16" in warnings[0] and "float32" in warnings[0]


@pytest.mark.parametrize("fast", [True, False])
def test_auto_dtype_builds_the_faster_engine_here(tmp_path, ckpt, monkeypatch, fast):
    cpu_without_gpu(monkeypatch, fast)
    result = build(tmp_path, ckpt, "e", "--json", dtype="auto")
    assert result.exit_code == 0, result.output
    data, want = json.loads(result.stdout), "bfloat16" if fast else "float32"
    assert (data["dtype"], data["kv_cache_dtype"], data["warnings"]) == (want, want, [])
    stored = yaml.safe_load((tmp_path / "e" / "eagle_config.yaml").read_text())
    assert (stored["dtype"], stored["kv_cache_dtype"]) == (want, want)  # the engine records the choice
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["dtype"] == want


def test_unexpected_error_exits_1(tmp_path, ckpt, monkeypatch):
    import eagle_trt.engine.builder as builder

    def broken(cfg, plan, root, max_shard_bytes):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(builder, "_write_engine", broken)
    result = build(tmp_path, ckpt, "e")
    assert result.exit_code == 1
    assert "RuntimeError: disk on fire" in result.stderr and "EAGLE_TRT_DEBUG=1" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["cfg.yaml"]  # no temp dir left behind


@pytest.mark.parametrize("backend", ["torch", "trtllm"])
def test_dry_run_writes_nothing(tmp_path, ckpt, backend):
    before = snapshot(ckpt)
    result = build(tmp_path, ckpt, "out/e", "--dry-run", "--json", "--backend", backend, dtype="bfloat16")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["files"] == {} and data["validated"] is True and "nothing written" in data["message"]
    assert data["backend"] == backend
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"]
    assert snapshot(ckpt) == before


@pytest.mark.parametrize("backend", ["torch", "trtllm"])
def test_two_builds_same_hashes(tmp_path, ckpt, backend):
    a = build(tmp_path, ckpt, "a", "--json", "--backend", backend, dtype="bfloat16", kv_cache_dtype="fp8")
    b = build(tmp_path, ckpt, "b", "--json", "--backend", backend, dtype="bfloat16", kv_cache_dtype="fp8")
    assert a.exit_code == b.exit_code == 0, a.output + b.output
    files_a, files_b = json.loads(a.stdout)["files"], json.loads(b.stdout)["files"]
    assert files_a == files_b  # every file, weights included, byte-identical
    weights = [f for f in files_a if f.endswith(".safetensors")]
    assert len(weights) >= 2
    for rel in weights:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


# ---- tampering: inspect and run refuse, --skip-verify skips only the hashing ------------------

@pytest.fixture
def engine(tmp_path, ckpt) -> Path:
    assert build(tmp_path, ckpt, "e").exit_code == 0
    return tmp_path / "e"


def refuse(engine: Path, message: str) -> None:
    for args in (["inspect", str(engine)], ["run", "--engine", str(engine), "--prompt", "hi"]):
        result = RUNNER.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.stderr.split()), result.stderr
        assert "hint: rebuild" in result.stderr


def test_flipped_byte_refused(engine):
    path = engine / "draft" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    refuse(engine, f"engine file '{path}' does not match its sha256 in manifest.json")
    result = RUNNER.invoke(app, ["inspect", str(engine), "--skip-verify", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["name"] == "tiny"


def test_truncated_file_refused(engine):
    path = engine / "target" / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    refuse(engine, f"engine file '{path}' has {size // 2} bytes, manifest.json says {size} (truncated or replaced)")
    result = RUNNER.invoke(app, ["inspect", str(engine), "--skip-verify"])
    assert result.exit_code == 2  # sizes are checked even without hashing


def test_deleted_manifest_refused(engine):
    (engine / "manifest.json").unlink()
    refuse(engine, "manifest.json' not found: ")


def test_half_written_engine_refused(engine):
    (engine / "tokenizer" / "tokenizer.json").unlink()  # as if the copy stopped midway
    refuse(engine, "tokenizer.json' is missing (listed in manifest.json)")


def test_inspect_verifies_and_prints(engine):
    result = RUNNER.invoke(app, ["inspect", str(engine), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["files"]["eagle_config.yaml"]["bytes"] > 0


def test_an_output_inside_the_checkpoint_is_refused(tmp_path, ckpt):
    """convert refuses an output inside its input; build now does too (replacing OUT would write into, or delete,
    the checkpoint)."""
    work = tmp_path / "c"
    shutil.copytree(ckpt, work)
    for out in (work / "target" / "engine", work, tmp_path):
        r = RUNNER.invoke(app, ["build", "-c", str(config(tmp_path)), "--checkpoint", str(work), "-o", str(out)])
        assert r.exit_code == 2 and "the checkpoint being built" in r.stderr, r.output
    assert not (work / "target" / "engine").exists() and (work / "target" / "config.json").is_file()
