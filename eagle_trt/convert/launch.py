"""`convert --nproc N`: the same convert run as N local processes under torch's elastic launcher (what torchrun is),
its rendezvous on 127.0.0.1, so one machine trains the head with N ranks without a torchrun command line.

    code = launch_local(4, ["model.gguf", "--output", "ckpt", "--data", "chats.jsonl", "--epochs", "2"])

Each worker is `python -m eagle_trt convert ARGS` with torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR set;
they print their own errors (rank 0's is the run's). The workers run in their own sessions (torch's launcher starts
them so), so a Ctrl-C at the terminal or a SIGTERM reaches them once, passed on by the launcher, which then waits
SHUTDOWN_TIMEOUT_S for them to finish the step and save the checkpoint.
Several machines: torchrun itself with a rendezvous endpoint (docs/training.md).
"""

from __future__ import annotations

import os
import sys
import uuid

from eagle_trt.errors import InputError

LOOPBACK = "127.0.0.1"
# How long the launcher waits, after passing on a Ctrl-C or SIGTERM, for the workers to finish their step and save
# the checkpoint before it kills them (torch's own default, 30 s, is shorter than one step of a large head).
SHUTDOWN_TIMEOUT_S = 600


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
    """Run `eagle_trt convert convert_args` as nproc ranks on this machine; the exit code of the run (0, or the first
    failed rank's: 130/143 after an interrupt that saved the checkpoint)."""
    if nproc < 1:
        raise InputError(f"--nproc must be >= 1; got {nproc}")
    if "WORLD_SIZE" in os.environ:
        raise InputError("--nproc starts its own launcher: drop it when running under torchrun")
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.update(worker_env(nproc, os.environ))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"eagle-trt-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint=f"{LOOPBACK}:0", max_restarts=0, monitor_interval=0.2,
                          local_addr=LOOPBACK, shutdown_timeout=int(os.environ.get(
                              "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT_S)))
    try:
        elastic_launch(config, sys.executable)("-m", "eagle_trt", "convert", *convert_args)
    except ChildFailedError as e:
        codes = [f.exitcode for _, f in sorted(e.failures.items())]
        code = codes[0]
        return 128 - code if code < 0 else code  # a worker killed by a signal: the shell's 128 + signum
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


__all__ = ["launch_local", "worker_env", "convert_args_without_nproc", "LOOPBACK"]
