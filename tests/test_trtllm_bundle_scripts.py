"""serve.sh, bench.sh and validate.py of a trtllm bundle, run for real with stand-ins for TensorRT-LLM.

serve.sh and bench.sh run under bash from another working directory, in a bundle whose path has a
space, a quote and an ampersand, with fake `trtllm-serve` / `trtllm-bench` first on PATH that record
what they were given. validate.py runs in a fresh interpreter: without tensorrt_llm (exit 3), and
with a fake tensorrt_llm (and a torch that reports a GPU) on PYTHONPATH.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import write_random_head
from eagle_trt.config import EagleConfig
from eagle_trt.engine import build_engine
from trtllm_fakes import VERSIONS, write_fake_packages

# Records argv, the YAML it was handed and what the model path is, then exits.
FAKE_TOOL = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
opts = args[args.index("--extra_llm_api_options") + 1]
model = args[0] if os.path.basename(sys.argv[0]) == "trtllm-serve" else args[args.index("--model_path") + 1]
json.dump({"argv": args, "cwd": os.getcwd(), "options_text": open(opts).read(), "model_is_link": os.path.islink(model),
           "model_real": os.path.realpath(model)}, open(os.environ["FAKE_RECORD"], "w"))
"""


@pytest.fixture(scope="module")
def bundles(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bundles")
    ckpt = base / "ckpt"
    shutil.copytree(tiny_model_dir, ckpt / "target")
    write_random_head(ckpt / "draft")
    out = {}
    for line in ("1.2", "1.3+"):
        cfg = EagleConfig(name="tiny-eng", backend="trtllm", dtype="bfloat16", trtllm_version=line, max_input_len=256,
                          max_output_len=128, draft_length=4, total_tokens=12, beam_width=3, lookup_tokens=0)  # fmt: skip
        out[line] = build_engine(cfg, ckpt, base / f'my "engines" & {line}' / "tiny-eng").engine_dir
    return out


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("trtllm-serve", "trtllm-bench"):
        (bin_dir / tool).write_text(FAKE_TOOL.replace("/usr/bin/env python3", sys.executable))
        (bin_dir / tool).chmod(0o755)
    record = tmp_path / "record.json"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_RECORD", str(record))
    return record


def run_script(script: Path, args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_serve_runs_from_anywhere_on_loopback_under_the_engine_name(bundles, fake_tools, tmp_path):
    root = bundles["1.3+"]
    elsewhere = tmp_path / "somewhere else"
    elsewhere.mkdir()
    out = run_script(root / "serve.sh", ["--log_level", "info"], cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    rec = json.loads(fake_tools.read_text())
    argv = rec["argv"]
    # Served under the config's name: trtllm-serve names a local model after its directory.
    assert Path(argv[0]).name == "tiny-eng" and rec["model_is_link"] and rec["model_real"] == str(root / "target")
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--tokenizer") + 1] == str(root / "tokenizer")
    assert argv[-2:] == ["--log_level", "info"] and rec["cwd"] == str(elsewhere)
    opts = yaml.safe_load(rec["options_text"])
    assert opts["speculative_config"]["speculative_model"] == str(root / "draft")  # absolute, quote and & intact
    assert Path(opts["speculative_config"]["speculative_model"]).is_dir()
    shipped = yaml.safe_load((root / "extra_llm_api_options.yaml").read_text())
    shipped["speculative_config"]["speculative_model"] = str(root / "draft")
    assert opts == shipped  # nothing else changed
    assert not Path(argv[0]).exists()  # the temp dir with the link is gone afterwards


SLEEPY_TOOL = """#!/usr/bin/env python3
import os, signal, sys, time
def stop(signum, frame):
    open(os.environ["FAKE_RECORD"], "w").write("terminated")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(os.environ["FAKE_RECORD"], "w").write("started")
time.sleep(60)
"""


def test_a_stop_signal_reaches_the_server_and_the_temp_dir_goes(bundles, tmp_path, monkeypatch):
    import signal
    import time

    bin_dir, record = tmp_path / "bin", tmp_path / "record.txt"
    bin_dir.mkdir()
    (bin_dir / "trtllm-serve").write_text(SLEEPY_TOOL.replace("/usr/bin/env python3", sys.executable))
    (bin_dir / "trtllm-serve").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_RECORD": str(record),
           "TMPDIR": str(tmp_path)}  # fmt: skip
    proc = subprocess.Popen(["bash", str(bundles["1.2"] / "serve.sh")], env=env, cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not (record.is_file() and record.read_text() == "started") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob("eagle-trt.*")), "no temp dir while serving"
    proc.send_signal(signal.SIGTERM)  # what `docker stop` sends to a container's first process
    assert proc.wait(timeout=30) == 0
    assert record.read_text() == "terminated" and not list(tmp_path.glob("eagle-trt.*"))


def test_serve_host_and_port_options_open_it(bundles, fake_tools, tmp_path):
    out = run_script(bundles["1.2"] / "serve.sh", ["--host", "0.0.0.0", "--port=9001"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    argv = json.loads(fake_tools.read_text())["argv"]
    assert (argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]) == ("0.0.0.0", "9001")
    assert argv.count("--host") == 1
    out = run_script(bundles["1.2"] / "serve.sh", [], cwd=tmp_path, env={"HOST": "10.1.2.3"})
    argv = json.loads(fake_tools.read_text())["argv"]
    assert argv[argv.index("--host") + 1] == "10.1.2.3"


def test_bench_takes_a_relative_dataset_from_the_callers_dir(bundles, fake_tools, tmp_path):
    root = bundles["1.2"]
    (tmp_path / "data.jsonl").write_text("{}\n")
    out = run_script(root / "bench.sh", ["data.jsonl", "--num_requests", "4"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rec = json.loads(fake_tools.read_text())
    argv = rec["argv"]
    assert argv[:4] == ["--model", "tiny-eng", "--model_path", str(root / "target")]
    assert argv[argv.index("--dataset") + 1] == "data.jsonl" and rec["cwd"] == str(tmp_path)
    assert yaml.safe_load(rec["options_text"])["speculative_config"]["speculative_model"] == str(root / "draft")
    assert run_script(root / "bench.sh", [], cwd=tmp_path).returncode != 0  # usage line, nothing run


# ---- validate.py -------------------------------------------------------------------------------

ALLOWED_IMPORTS = {"__future__", "argparse", "json", "re", "sys", "time", "pathlib", "yaml", "torch", "tensorrt_llm",
                   "tensorrt_llm.llmapi"}  # fmt: skip


def test_validate_imports_only_tensorrt_llm_and_the_stdlib(bundles):
    tree = ast.parse((bundles["1.2"] / "validate.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module)
    assert names <= ALLOWED_IMPORTS, names - ALLOWED_IMPORTS  # no eagle_trt, no modelopt


def run_validate(root: Path, fake_dir: Path | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if fake_dir is not None:
        env["PYTHONPATH"] = str(fake_dir)
    return subprocess.run([sys.executable, str(root / "validate.py"), *args], cwd="/", capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip


def test_validate_without_tensorrt_llm_exits_3(bundles):
    out = run_validate(bundles["1.3+"], None)
    assert out.returncode == 3 and out.stdout == ""
    assert out.stderr.strip().startswith("validate: TensorRT-LLM is not installed (No module named 'tensorrt_llm')")


@pytest.mark.parametrize("line", ["1.2", "1.3+"])
def test_validate_compares_spec_with_plain_output(bundles, tmp_path, line):
    out = run_validate(bundles[line], write_fake_packages(tmp_path, line), "--max-tokens", "4", "--json", str(tmp_path / "v.json"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == f"TensorRT-LLM {VERSIONS[line]}, bundle for line {line} ({'dynamic' if line == '1.3+' else 'chain'}), GPU FakeGPU"
    assert lines[1] == ("prompt 1: 4 tokens in 2 iterations (2.00 tokens/iteration, draft tokens not reported); "
                        "speculative == plain: yes")
    assert lines[-1].startswith("PASS: speculative output equals plain greedy output on 3 prompts")
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["equal"] and report["prompts"][0]["tokens_per_iteration"] == 2.0


@pytest.mark.parametrize("differ, unequal", [("1", 3), ("2", 1)])
def test_validate_fails_when_outputs_differ(bundles, tmp_path, monkeypatch, differ, unequal):
    """The fake's speculative output differs from its plain output (in every prompt, or only the second): the
    equality check that the passing test above relies on must catch it, prompt by prompt."""
    monkeypatch.setenv("FAKE_DIFFER", differ)
    out = run_validate(bundles["1.2"], write_fake_packages(tmp_path, "1.2"), "--max-tokens", "4")
    assert out.returncode == 1
    assert out.stdout.count("speculative == plain: NO") == unequal and out.stdout.strip().endswith("s)")
    assert "FAIL: outputs differ on 3 prompts" in out.stdout


def test_validate_refuses_a_bundle_of_another_line(bundles, tmp_path):
    out = run_validate(bundles["1.2"], write_fake_packages(tmp_path, "1.3+"))
    assert out.returncode == 2
    assert out.stderr.strip() == ("validate: this bundle is for TensorRT-LLM 1.2 but 1.3.0rc27 is installed: "
                                  "rebuild it with `eagle-trt build --trtllm-version 1.3+`")


@pytest.mark.parametrize("version, line, code", [("1.3.0rc5", "1.2", 0), ("1.3.0rc9.post1", "1.2", 0),
                                                 ("1.3.0rc10", "1.2", 2), ("1.2.0rc7", "1.2", 0),
                                                 ("1.2.0rc6.post3", "1.2", 2), ("1.3.0rc10.dev2026", "1.3+", 0)])
def test_validate_tells_the_line_of_the_installed_release_from_trtllm_json(bundles, tmp_path, version, line, code):
    """validate.py reads the releases of each line from trtllm.json (written from trtllm_lines): a 1.3 rc before
    the dynamic tree reads 1.2 bundles, a 1.2 rc before Eagle3 reads none."""
    out = run_validate(bundles[line], write_fake_packages(tmp_path, line, version=version), "--max-tokens", "4")
    assert out.returncode == code, out.stdout + out.stderr
    if version == "1.2.0rc6.post3":
        assert out.stderr.strip() == ("validate: this bundle is for TensorRT-LLM 1.2 but 1.2.0rc6.post3 is installed: "
                                      "it reads decoding_type Eagle3 / Draft_Target, which TensorRT-LLM has from "
                                      "1.2.0rc7: install that or newer")
    elif version == "1.3.0rc10":
        assert "rebuild it with `eagle-trt build --trtllm-version 1.3+`" in out.stderr


def test_validate_parses_releases_as_trtllm_lines_does(bundles):
    import importlib.util

    from eagle_trt.engine.trtllm_lines import parse_release

    spec = importlib.util.spec_from_file_location("bundle_validate", bundles["1.2"] / "validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for version in ("1.2.1", "1.2.0rc6.post3", "1.3.0rc27", "1.3.0rc26.dev202609050001", "1.4.0rc4", "1.2",
                    "1.3.0+cu130", "2.0.0", "?", "", "1.2.0a1", "v1.2.1"):
        assert module.release_key(version) == parse_release(version), version


def test_validate_without_a_gpu_exits_3(bundles, tmp_path):
    out = run_validate(bundles["1.3+"], write_fake_packages(tmp_path, "1.3+", gpu=False))
    assert out.returncode == 3 and "no CUDA GPU is visible" in out.stderr


def test_eagle_trt_serve_on_a_bundle_runs_its_serve_sh(bundles, fake_tools, tmp_path):
    root = bundles["1.3+"]
    out = subprocess.run([sys.executable, "-m", "eagle_trt", "serve", "--engine", str(root), "--port", "8123"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    argv = json.loads(fake_tools.read_text())["argv"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8123"
    refused = subprocess.run([sys.executable, "-m", "eagle_trt", "serve", "--engine", str(root), "--api-key", "k"],
                             cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--api-key" in refused.stderr and "reverse proxy" in refused.stderr
    # trtllm-serve checks no key: an address other than loopback only when the user says a proxy guards it.
    exposed = [sys.executable, "-m", "eagle_trt", "serve", "--engine", str(root), "--host", "0.0.0.0", "--port", "8123"]
    refused = subprocess.run(exposed, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "reverse proxy" in refused.stderr and "--allow-unauthenticated" in refused.stderr
    allowed = subprocess.run([*exposed, "--allow-unauthenticated"], cwd=Path(__file__).resolve().parents[1],
                             capture_output=True, text=True, timeout=120)  # the fake trtllm-serve binds nothing
    assert allowed.returncode == 0, allowed.stderr
    argv = json.loads(fake_tools.read_text())["argv"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
