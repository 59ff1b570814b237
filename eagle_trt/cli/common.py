"""Shared CLI plumbing: consoles, the error policy, JSON output, shared option types."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from eagle_trt.errors import EXIT_FAILURE, EagleError
from eagle_trt.staging import Terminated, terminate_like_interrupt

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
LOG_WIDTH = 160  # columns for wide tables when stdout is not a terminal (rich would fall back to 80)


def print_wide(renderable) -> None:
    """Print on stdout; when it is not a terminal (CI logs, `| tee`), at LOG_WIDTH columns so wide tables
    stay whole instead of being cut to 80."""
    width = console.width
    if not console.is_terminal:
        console.width = max(width, LOG_WIDTH)
    try:
        console.print(renderable)
    finally:
        console.width = width

EXIT_CODES_HELP = "Exit codes: 0 ok, 2 bad config or input, 3 missing dependency or hardware, 1 anything else."

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")]
EngineOpt = Annotated[Path, typer.Option("--engine", "-e", help="Engine dir written by `eagle-trt build`.")]
SkipVerifyOpt = Annotated[bool, typer.Option(
    "--skip-verify", help="Do not check the sha256 of every engine file on load (faster, less safe).")]


DEFAULT_SHARD_SIZE = "5GB"
MaxShardOpt = Annotated[str, typer.Option(
    "--max-shard-size", help="Largest weight file written (e.g. 5GB, 500MB, 2GiB); larger models are split into "
                             "model-0000i-of-0000N.safetensors shards with an index, as transformers writes them.")]
ThreadsOpt = Annotated[Optional[int], typer.Option(
    "--threads", help="CPU threads for torch (default: all cores). On a busy machine use fewer: a thread that "
                      "waits for a busy core stalls every matrix product.")]


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def apply_threads(threads: int | None) -> None:
    if threads is not None:
        from eagle_trt.errors import InputError

        cpus = available_cpus()
        if not 1 <= threads <= cpus:
            raise InputError(f"--threads must be in [1, {cpus}] (the CPUs this process may use), got {threads}")
        import torch

        torch.set_num_threads(threads)


def require_engine(engine) -> None:
    """The one check every engine command makes before loading anything."""
    from pathlib import Path as _Path

    from eagle_trt.errors import InputError

    if not _Path(engine).exists():
        raise InputError(f"engine dir '{engine}' does not exist", hint="build one with `eagle-trt build --config ...`")


def debug_enabled() -> bool:
    return os.environ.get("EAGLE_TRT_DEBUG", "") not in ("", "0", "false")


def fail(message: str, code: int, hint: str | None = None) -> None:
    err_console.print(f"[bold red]Error:[/] {escape(message)}", soft_wrap=True)
    if hint:
        err_console.print(f"  hint: {escape(hint)}", soft_wrap=True)
    raise typer.Exit(code)


def handle_errors(fn):
    """One error policy for every command: one line on stderr, a distinct exit code, traceback only in debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        terminate_like_interrupt()  # SIGTERM unwinds like Ctrl-C: temp dirs removed, checkpoints saved
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except EagleError as e:
            if debug_enabled():
                raise
            fail(e.message, e.exit_code, e.hint)
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly, nothing is wrong here
            _silence_stdout()
            raise typer.Exit(0) from None
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated); a saved training checkpoint says so
            what = "Terminated" if isinstance(e, Terminated) or getattr(e, "exit_code", 0) == Terminated.exit_code \
                else "Interrupted"
            err_console.print(f"{what}: {escape(str(e))}" if str(e) else f"{what}.", soft_wrap=True)
            raise typer.Exit(getattr(e, "exit_code", 130)) from None
        except Exception as e:  # noqa: BLE001 - last-resort boundary of the CLI
            if debug_enabled():
                raise
            fail(f"{type(e).__name__}: {e}", EXIT_FAILURE, "rerun with EAGLE_TRT_DEBUG=1 for the traceback")

    return wrapper


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not hit the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (a test's capture)
        pass


def print_json(obj: Any) -> None:
    # Plain stdout write: rich would wrap long lines and break the JSON.
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()
