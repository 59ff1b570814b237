"""Inputs a hostile (or careless) user gives: each is one line on stderr and exit 2, never a traceback; a closed pipe
ends `run` quietly; `run --json` says whether the output is guaranteed lossless."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from eagle_trt.cli.app import app

cli = CliRunner()
CLI = [sys.executable, "-c", "from eagle_trt.cli.app import main; main()"]


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("hostile"))


def one_line_exit_2(r, starts: str):
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(starts), r.stderr
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) <= 2  # the message and its hint


@pytest.mark.parametrize("args, starts", [
    (["--temperature", "nan"], "Error: --temperature must be 0 (greedy) or a finite value >= 1e-05, got nan"),
    (["--temperature", "inf"], "Error: --temperature must be 0 (greedy) or a finite value >= 1e-05, got inf"),
    (["--temperature", "1e-320"], "Error: --temperature must be 0 (greedy) or a finite value >= 1e-05, got 1e-320"),
    (["--temperature", "-1"], "Error: --temperature must be 0 (greedy)"),
    (["--temperature", "0.5", "--seed", str(10**23)], "Error: --seed must be in [0, 2**64 - 1]"),
    (["--seed", "-3"], "Error: --seed must be in [0, 2**64 - 1], got -3"),
    (["--threads", "1000"], "Error: --threads must be in [1, "),
    (["--top-p", "nan"], "Error: --top-p must be in (0, 1], got nan"),
    (["--confidence-threshold", "nan"], "Error: --confidence-threshold must be in [0, 1), got nan"),
    (["--total-tokens", "100000"], "Error: --total-tokens must be in [1, 512], got 100000"),
])
def test_bad_run_options(engine, args, starts):
    one_line_exit_2(cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", *args]), starts)


def test_total_tokens_names_the_tree_not_max_new_tokens(engine):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--total-tokens", "100000"])
    assert "--total-tokens" in r.stderr and "--max-new-tokens" not in r.stderr


def test_a_prompt_that_is_not_utf8(engine):
    # What Python makes of non-UTF-8 bytes in argv: lone surrogates.
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", b"caf\xe9".decode("utf-8", "surrogateescape")])
    one_line_exit_2(r, "Error: the prompt is not UTF-8 text")


def test_a_non_utf8_prompt_from_a_real_shell(engine):
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    proc = subprocess.run([*CLI, "run", "--engine", str(engine), "--prompt", b"caf\xe9"], capture_output=True,
                          env=env)
    assert proc.returncode == 2 and proc.stderr.startswith(b"Error: the prompt is not UTF-8 text"), proc.stderr


def test_build_into_an_unwritable_place(tiny_checkpoint, tmp_path):
    (tmp_path / "file").write_text("x")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {tiny_checkpoint}\nmax_input_len: 64\nmax_output_len: 64\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "file" / "engine")])
    one_line_exit_2(r, f"Error: cannot write the engine '{tmp_path / 'file' / 'engine'}'")


def test_run_into_a_closed_pipe_ends_quietly(engine):
    """`eagle-trt run ... | head -c 10`: the reader leaves early; no BrokenPipeError, no traceback."""
    proc = subprocess.Popen([*CLI, "run", "--engine", str(engine), "--prompt", "hi", "--max-new-tokens", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_run_json_says_whether_the_output_is_lossless(engine):
    def run(*args):
        r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--max-new-tokens", "4", "--json",
                             *args])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["metrics"]

    from eagle_trt.runtime.session import Session

    row_invariant = bool(getattr(Session.open(engine).runner.target, "row_invariant", False))
    m = run()
    assert m["lossless"] is row_invariant and m["lossless_note"]
    assert run("--mode", "ar")["lossless"] is True
    typical = run("--temperature", "0.7", "--posterior-threshold", "0.09")
    assert typical["lossless"] is False and typical["lossless_note"].startswith("lossy by choice")
    assert "Infinity" not in json.dumps(m)
