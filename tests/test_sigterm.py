"""SIGTERM (what `timeout`, `docker stop` and a cancelled CI job send) unwinds `build` and `convert` like Ctrl-C: exit
143, no hidden temp dir left behind, an earlier output untouched; and a later run removes what a process killed
outright (SIGKILL) left, but never a live process's work dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eagle_trt.staging import Terminated, staged_dir, sweep_stale, swap_into_place, terminate_like_interrupt

CLI = [sys.executable, "-c", "from eagle_trt.cli.app import main; main()"]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def hidden(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def terminate_when(proc: subprocess.Popen, appeared, timeout: float = 120) -> int:
    """Freeze the process as soon as `appeared()` holds (so it cannot finish meanwhile), send SIGTERM, let it go on;
    return its exit code."""
    deadline = time.monotonic() + timeout
    while not appeared():
        assert proc.poll() is None, f"exited {proc.returncode} before the moment to stop it: {proc.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGTERM)
    os.kill(proc.pid, signal.SIGCONT)
    return proc.wait(timeout=timeout)


def test_sweep_removes_only_dead_processes_dirs(tmp_path):
    out = tmp_path / "engine"
    dead = tmp_path / f".engine.tmp-{dead_pid()}-abc0"
    other_kind = tmp_path / ".engine.train"
    other_name = tmp_path / f".engine2.tmp-{dead_pid()}-abc0"
    for d in (dead, other_kind, other_name):
        d.mkdir()
    (dead / "weights").write_bytes(b"x" * 10)
    with staged_dir(out, "tmp") as live:  # this process's own
        assert oct(live.stat().st_mode & 0o777) == "0o755"
        assert sweep_stale(out, ("tmp", "old")) == [dead]
        assert not dead.exists() and live.is_dir() and other_kind.is_dir() and other_name.is_dir()
        swap_into_place(live, out)
    assert out.is_dir() and hidden(tmp_path, "engine") == [".engine.train"]


def test_a_parked_output_is_put_back_not_deleted(tmp_path):
    """A process killed between the two renames of a swap leaves the previous output in its "old" dir: the next run
    restores it."""
    out = tmp_path / "ckpt"
    parked = tmp_path / f".ckpt.old-{dead_pid()}-0a0b"
    (parked / "ckpt").mkdir(parents=True)
    (parked / "ckpt" / "convert.json").write_text("{}")
    assert sweep_stale(out, ("partial", "old")) == [parked]
    assert (out / "convert.json").read_text() == "{}" and not parked.exists()


def test_a_failed_block_leaves_nothing_and_the_old_output_stays(tmp_path):
    out = tmp_path / "e"
    out.mkdir()
    (out / "manifest.json").write_text("old")
    with pytest.raises(RuntimeError):
        with staged_dir(out, "tmp") as tmp:
            (tmp / "manifest.json").write_text("new")
            raise RuntimeError("late failure")
    assert (out / "manifest.json").read_text() == "old" and hidden(tmp_path, "e") == []


def test_sigterm_raises_terminated_and_staged_output_cleans_up(tmp_path):
    from eagle_trt.convert.export import staged_output

    previous = signal.getsignal(signal.SIGTERM)
    try:
        terminate_like_interrupt()
        with pytest.raises(Terminated):
            with staged_output(tmp_path / "ckpt") as stage:
                (stage / "target").mkdir()
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises at the next bytecode; never reached
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def deep_checkpoint(tmp_path_factory):
    """A tiny-width model with many layers: tens of MB, so a build takes long enough to be stopped midway."""
    from conftest import write_random_head
    from make_tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("deep") / "ckpt"
    make_tiny_model(root / "target", seed=0, num_hidden_layers=240)
    write_random_head(root / "draft")
    return root


def test_sigterm_during_build_leaves_nothing_and_keeps_the_old_engine(deep_checkpoint, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(dict(name="deep", checkpoint_dir=str(deep_checkpoint), max_input_len=64,
                                       max_output_len=64)))
    out = tmp_path / "engines" / "deep"
    first = subprocess.run([*CLI, "build", "-c", str(cfg), "-o", str(out)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    before = {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")}
    # A stale dir of a build killed outright, found and removed by the next build.
    stale = out.parent / f".deep.tmp-{dead_pid()}-0f0f"
    stale.mkdir()
    proc = subprocess.Popen([*CLI, "build", "-c", str(cfg), "-o", str(out)], stderr=subprocess.PIPE,
                            text=True)
    code = terminate_when(proc, lambda: any(n.startswith(".deep.tmp-") and n != stale.name
                                            for n in hidden(out.parent, "deep")))
    assert code == 143, proc.stderr.read()
    assert "Terminated" in proc.stderr.read()
    assert hidden(out.parent, "deep") == []  # its own temp dir, and the stale one it swept
    assert {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_sigterm_during_convert_leaves_nothing(tiny_model_dir, tmp_path):
    out = tmp_path / "ckpt"
    proc = subprocess.Popen([*CLI, "convert", str(tiny_model_dir), "--output", str(out), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    code = terminate_when(proc, lambda: any(n.startswith(".ckpt.partial-") for n in hidden(tmp_path, "ckpt")))
    assert code == 143, proc.stderr.read()
    assert list(tmp_path.iterdir()) == []
