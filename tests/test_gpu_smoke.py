"""scripts/gpu_check_trtllm.py: its CPU part for real, its GPU part against a stand-in TensorRT-LLM.

Here (no tensorrt_llm) the script builds the tiny bundles and stops with exit code 3 after saying
why. With a fake tensorrt_llm and a torch that reports a GPU on PYTHONPATH, a second run on the same
bundles walks the config and generate steps through each bundle's validate.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trtllm_fakes import contract_violations, write_fake_packages

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check_trtllm.py"


def smoke(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_DIFFER")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env={**base, **(env or {})}, cwd=REPO)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    work = tmp_path_factory.mktemp("smoke")
    return work, smoke("--workdir", str(work), "--json-out", str(work / "smoke.json"))


def test_cpu_part_builds_small_bundles_and_exits_3_without_tensorrt_llm(built):
    work, out = built
    assert out.returncode == 3, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("[PASS] bundles: 8 bundles under ")
    assert lines[1].startswith("[PASS] versions: python ") and "tensorrt_llm None" in lines[1]
    assert lines[2] == ("[SKIP] config: TensorRT-LLM is not installed (ModuleNotFoundError: No module named "
                        "'tensorrt_llm'): the GPU steps need TensorRT-LLM and an NVIDIA GPU")
    assert lines[-1] == "2 passed, 0 failed, 1 skipped"
    assert json.loads((work / "smoke.json").read_text())["exit_code"] == 3
    bundles = sorted((work / "bundles").glob("*/*/trtllm.json"))
    seen = set()
    for meta_path in bundles:
        root, meta = meta_path.parent, json.loads(meta_path.read_text())
        doc = yaml.safe_load((root / "extra_llm_api_options.yaml").read_text())
        assert contract_violations(doc, meta["trtllm_version"]) == []
        seen.add((meta["trtllm_version"], meta["drafter"], meta["tree"], doc["kv_cache_config"]["dtype"]))
        assert sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) < 12 * 2**20  # a few MB
    assert seen == {("1.3+", "eagle3", "chain", "auto"), ("1.3+", "eagle3", "chain", "fp8"),
                    ("1.3+", "eagle3", "dynamic", "auto"), ("1.3+", "eagle3", "dynamic", "fp8"),
                    ("1.2", "eagle3", "chain", "auto"), ("1.2", "eagle3", "chain", "fp8"),
                    ("1.3+", "model", "chain", "auto"), ("1.2", "model", "chain", "auto")}  # fmt: skip


def fake_env(fake: Path) -> dict:
    """The fake tensorrt_llm importable and its trtllm-serve first on PATH."""
    return {"PYTHONPATH": str(fake), "PATH": f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def test_gpu_part_runs_each_bundle_of_the_installed_line(built, tmp_path):
    work, _ = built
    fake = write_fake_packages(tmp_path, "1.3+")
    out = smoke("--bundles-from", str(work), "--max-tokens", "4", env=fake_env(fake))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert "tensorrt_llm 1.3.0rc27" in lines[1] and "gpu FakeGPU" in lines[1]
    assert lines[2] == "[PASS] config: line 1.3+: 5 bundles' YAML read the trtllm-serve way by TensorRT-LLM 1.3.0rc27"
    assert lines[3].startswith("[PASS] serve smoke-chain-auto: /v1/completions as smoke-chain-auto: HTTP 200 ")
    generate = [ln for ln in lines if ln.startswith("[PASS] generate smoke-")]
    assert len(generate) == 5 and all("speculative == plain: yes" in ln for ln in generate)
    assert any(ln.startswith("[PASS] generate smoke-draftmodel-chain-auto") for ln in generate)
    assert lines[-1] == "9 passed, 0 failed, 0 skipped"


def test_a_release_that_parses_no_eagle3_fails_on_the_serve_path(built, tmp_path):
    """1.2.0rc6's Eagle3DecodingConfig class can be built directly, but its YAML parser (the trtllm-serve path)
    knows decoding_type Eagle and DraftTarget only: the config and serve steps must both show the rejection."""
    work, _ = built
    fake = write_fake_packages(tmp_path, "1.2", version="1.2.0rc6.post3")
    out = smoke("--bundles-from", str(work), "--max-tokens", "4", "--trtllm-version", "1.2", env=fake_env(fake))
    assert out.returncode == 1, out.stdout + out.stderr
    config = next(ln for ln in out.stdout.splitlines() if ln.startswith("[FAIL] config: line 1.2: "))
    assert json.loads(config.split("line 1.2: ", 1)[1]) == {
        "smoke-chain-auto": "ValueError: Invalid decoding type: Eagle3",
        "smoke-chain-fp8": "ValueError: Invalid decoding type: Eagle3",
        "smoke-draftmodel-chain-auto": "ValueError: Invalid decoding type: Draft_Target"}
    assert "[FAIL] serve smoke-chain-auto: trtllm-serve exited with 1: " in out.stdout
    assert "Invalid decoding type: Eagle3" in out.stdout
    # Without --trtllm-version the release is refused up front, with the reason in one line.
    out = smoke("--bundles-from", str(work), "--max-tokens", "4", env=fake_env(fake))
    assert out.returncode == 1 and "[FAIL] config: TensorRT-LLM 1.2.0rc6.post3 predates speculative_config." \
        "decoding_type Eagle3 and Draft_Target" in out.stdout, out.stdout


@pytest.mark.parametrize("line, bundles", [("1.2", 3), ("1.3+", 5)])
def test_unequal_outputs_warn_on_random_models_and_fail_when_strict(built, tmp_path, line, bundles):
    """The "speculative == plain: yes" above comes from a fake whose two outputs agree; here they disagree (the
    fake's FAKE_DIFFER), and the smoke check must say so for every bundle of the line."""
    work, _ = built
    env = {**fake_env(write_fake_packages(tmp_path, line)), "FAKE_DIFFER": "1"}
    out = smoke("--bundles-from", str(work), "--max-tokens", "4", "--no-serve", env=env)
    assert out.returncode == 0 and out.stdout.count("[WARN] generate smoke-") == bundles, out.stdout
    out = smoke("--bundles-from", str(work), "--max-tokens", "4", "--strict-lossless", "--no-serve", env=env)
    assert out.returncode == 1 and out.stdout.strip().endswith(f"3 passed, {bundles} failed, 0 skipped"), out.stdout
