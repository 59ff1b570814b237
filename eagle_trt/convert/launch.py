"""`convert --nproc N`: the same convert run as N local processes, so one machine trains the head with N ranks
without a torchrun command line.

    code = launch_local(4, ["model.gguf", "--output", "ckpt", "--data", "chats.jsonl", "--epochs", "2"])

Each worker is `python -m eagle_trt convert ARGS` with torchrun's RANK / WORLD_SIZE / LOCAL_RANK names set (what
distributed.World reads) and EAGLE_TRT_DIST_STORE naming a file in a private temp dir: the ranks meet through that
file (torch's FileStore), and gloo/NCCL talk over the loopback interface, so nothing listens beyond 127.0.0.1.
The workers print their own errors (rank 0's is the run's). Each runs in its own session, so a Ctrl-C at the
terminal or a SIGTERM reaches it once, passed on by the launcher, which then waits SHUTDOWN_TIMEOUT_S for the
workers to finish the step and save the checkpoint before it kills them.
Several machines: torchrun itself with a rendezvous endpoint (docs/training.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle_trt.errors import InputError

STORE_ENV = "EAGLE_TRT_DIST_STORE"
# How long the launcher waits, after passing on a Ctrl-C or SIGTERM, for the workers to finish their step and save
# the checkpoint before it kills them (one step of a large head takes minutes); EAGLE_TRT_SHUTDOWN_TIMEOUT_S overrides.
SHUTDOWN_TIMEOUT_S = 600
# After one rank fails, how long the others may take to exit on their own before they get SIGTERM: a rank stopped by
# the stop protocol exits right behind the first, and a SIGTERM landing after its handler is gone would cut it short.
FAILURE_GRACE_S = 5.0


def worker_env(nproc: int, env: dict[str, str]) -> dict[str, str]:
    """What the workers inherit beyond the launcher's own variables: the cores shared out (one process's OpenMP pool
    per rank, not N pools each as large as the machine) and the collectives' sockets on the loopback interface."""
    out = {}
    if "OMP_NUM_THREADS" not in env:
        out["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if name not in env:
            out[name] = "lo"
    return out


def rank_env(rank: int, nproc: int, store: Path, env: dict[str, str]) -> dict[str, str]:
    """The whole environment of worker `rank` of an nproc-rank run on this machine meeting through file `store`."""
    n = str(nproc)
    return {**env, **worker_env(nproc, env), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": n,
            "LOCAL_WORLD_SIZE": n, "GROUP_RANK": "0", STORE_ENV: str(store)}


def convert_args_without_nproc(argv: list[str]) -> list[str]:
    """The arguments after `convert` in a command line, without its --nproc option (the workers must not relaunch)."""
    if "convert" not in argv:
        raise InputError("--nproc: cannot find the convert arguments on this command line; run torchrun instead")
    rest, out = argv[argv.index("convert") + 1:], []
    skip = False
    for arg in rest:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def launch_local(nproc: int, convert_args: list[str]) -> int:
    """Run `eagle_trt convert convert_args` as nproc ranks on this machine; the exit code of the run (see run_ranks)."""
    if nproc < 1:
        raise InputError(f"--nproc must be >= 1; got {nproc}")
    if "WORLD_SIZE" in os.environ:
        raise InputError("--nproc starts its own launcher: drop it when running under torchrun")
    return run_ranks(nproc, [sys.executable, "-m", "eagle_trt", "convert", *convert_args])


def run_ranks(nproc: int, cmd: list[str]) -> int:
    """Run `cmd` as nproc ranks on this machine until all have exited; 0, or the first failed rank's code (130/143
    after an interrupt that saved the checkpoint, 128 + signum for a rank killed by a signal), or 128 + signum when
    the launcher itself got SIGINT/SIGTERM."""
    raw = os.environ.get("EAGLE_TRT_SHUTDOWN_TIMEOUT_S", str(SHUTDOWN_TIMEOUT_S))
    try:
        shutdown_s = float(raw)
    except ValueError:
        raise InputError(f"EAGLE_TRT_SHUTDOWN_TIMEOUT_S must be a number of seconds; got {raw!r}") from None
    procs: list[subprocess.Popen] = []
    got: list[int] = []  # the signal the launcher got; it reaches each worker once
    stop = {"term_at": None, "kill_at": None}  # when the live workers get SIGTERM / SIGKILL (monotonic seconds)

    def pass_on(signum: int) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
        stop["term_at"], stop["kill_at"] = float("inf"), time.monotonic() + shutdown_s

    def on_signal(signum, frame):
        if not got:
            got.append(signum)
            pass_on(signum)

    failed = None  # the first failed rank's exit code
    with tempfile.TemporaryDirectory(prefix="eagle-trt-ranks-") as tmp:
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for rank in range(nproc):  # own sessions: a terminal's Ctrl-C reaches the launcher alone
                procs.append(subprocess.Popen(cmd, env=rank_env(rank, nproc, Path(tmp) / "store", dict(os.environ)),
                                              start_new_session=True))
            while None in (codes := [p.poll() for p in procs]):  # every rank polled, each turn
                now = time.monotonic()
                if failed is None:
                    failed = next((c for c in codes if c not in (None, 0)), None)
                    if failed is not None and stop["term_at"] is None:  # no rank may wait in a collective for it
                        stop["term_at"] = now + FAILURE_GRACE_S
                if stop["term_at"] is not None and now >= stop["term_at"]:
                    pass_on(signal.SIGTERM)
                if stop["kill_at"] is not None and now >= stop["kill_at"]:
                    for p in procs:
                        p.kill()
                time.sleep(0.05)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for p in procs:  # no worker outlives the launcher or its store
                if p.poll() is None:
                    p.kill()
                    p.wait()
    if got:
        return 128 + got[0]
    failed = failed if failed is not None else next((c for c in codes if c), 0)
    return 128 - failed if failed < 0 else failed  # a worker killed by a signal: the shell's 128 + signum


__all__ = ["launch_local", "run_ranks", "rank_env", "worker_env", "convert_args_without_nproc", "STORE_ENV"]
