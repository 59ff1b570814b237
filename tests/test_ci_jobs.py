"""The example CI jobs (docs/ci/): the CPU job's commands, run here on a tiny model, as the job runs them.

The GitHub Actions and GitLab CI examples must hold the same CPU commands; the test takes them from
the YAML files, runs them under bash with the job's environment pointed at a tiny random Llama, and
checks what the job uploads: the bundle with its manifest, build.json and inspect.json. The GPU job
is checked for what it runs (validate.py inside NVIDIA's TensorRT-LLM image).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
GITHUB = yaml.safe_load((REPO / "docs" / "ci" / "github-actions.yml").read_text())
GITLAB = yaml.safe_load((REPO / "docs" / "ci" / "gitlab-ci.yml").read_text())


def github_cpu_commands() -> list[str]:
    steps = GITHUB["jobs"]["build-bundle"]["steps"]
    runs = [s["run"] for s in steps if "run" in s and s.get("id") != "install"]  # the install is the runner's
    return [ln.strip() for block in runs for ln in block.splitlines() if ln.strip()]


def gitlab_cpu_commands() -> list[str]:
    return [ln.strip() for cmd in GITLAB["build-bundle"]["script"] for ln in cmd.splitlines() if ln.strip()]


def test_both_examples_run_the_same_cpu_commands_and_upload_the_bundle():
    assert github_cpu_commands() == gitlab_cpu_commands()
    assert GITHUB["env"] == GITLAB["variables"]
    upload = next(s for s in GITHUB["jobs"]["build-bundle"]["steps"] if s.get("uses", "").startswith("actions/upload"))
    assert upload["with"]["path"].split() == GITLAB["build-bundle"]["artifacts"]["paths"]
    assert GITHUB["env"]["ENGINE"] == "out/engine"  # the uploaded dir
    download = next(s for s in GITHUB["jobs"]["validate-on-gpu"]["steps"] if s.get("uses", "").startswith("actions/down"))
    assert download["with"]["name"] == upload["with"]["name"] and download["with"]["path"] == "out"


def test_gpu_jobs_validate_inside_tensorrt_llm_images():
    gh, gl = GITHUB["jobs"]["validate-on-gpu"], GITLAB["validate-on-gpu"]
    assert gh["container"]["image"].startswith("nvcr.io/nvidia/tensorrt-llm/release:")
    assert gl["image"] == gh["container"]["image"] and "--gpus all" in gh["container"]["options"]
    run = [s["run"] for s in gh["steps"] if "run" in s]
    assert run == ["python3 out/engine/validate.py --max-tokens 32 --json out/validate.json"] == gl["script"]
    assert gl["needs"] == ["build-bundle"] and gh["needs"] == "build-bundle"


def run_job(commands: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    script = "set -eo pipefail\n" + "\n".join(commands) + "\n"
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env, "PATH": path})  # fmt: skip


@pytest.fixture(scope="module")
def job_env(tiny_model_dir, tmp_path_factory) -> tuple[Path, dict]:
    work = tmp_path_factory.mktemp("ci")
    (work / "eagle_config.yaml").write_text(
        "name: ci-tiny\nbackend: trtllm\ndtype: bfloat16\nmax_input_len: 256\nmax_output_len: 128\n"
        "draft_length: 4\ntotal_tokens: 12\nbeam_width: 3\nlookup_tokens: 0\n")
    env = {**GITHUB["env"], "MODEL": str(tiny_model_dir), "CONVERT_ARGS": "--no-validate"}
    return work, env


def test_cpu_job_builds_and_uploads_a_bundle(job_env):
    work, env = job_env
    out = run_job(github_cpu_commands(), work, env)
    assert out.returncode == 0, out.stderr[-3000:]
    build = json.loads((work / "out" / "build.json").read_text())
    assert build["backend"] == "trtllm" and build["trtllm"]["trtllm_version"] == env["TRTLLM_VERSION"]
    engine = work / env["ENGINE"]
    assert (engine / "manifest.json").is_file() and (engine / "validate.py").is_file()
    inspect = json.loads((work / "out" / "inspect.json").read_text())
    assert inspect["backend"] == "trtllm" and inspect["trtllm"]["served_model_name"] == "ci-tiny"
    assert set(build["files"]) == set(inspect["files"])


def test_cpu_job_stops_with_the_build_exit_code(job_env):
    work, env = job_env
    (work / "bad.yaml").write_text("name: ci-tiny\nbackend: trtllm\ndtype: float32\n")  # trtllm serves fp16/bf16 only
    build = [c for c in github_cpu_commands() if c.startswith("eagle-trt build")]
    out = run_job(["mkdir -p out", *build, "echo not reached"], work, {**env, "CONFIG": "bad.yaml"})
    assert out.returncode == 2 and "not reached" not in out.stdout
    assert "eagle-trt build failed with exit code 2 (2: config or input, 3: missing dependency)" in out.stderr
    assert "Error: dtype float32 is not supported by backend trtllm" in out.stderr
