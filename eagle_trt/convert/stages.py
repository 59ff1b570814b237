"""What `convert` and its variants print while they work and record when done: one status line per stage on stderr
(stdout stays free for --json) with its time and the process's peak memory, and the library versions."""

from __future__ import annotations

import contextlib
import resource
import time
from importlib.metadata import PackageNotFoundError, version

from rich.console import Console

import eagle_trt


def versions() -> dict:
    found = {"eagle_trt": eagle_trt.__version__}
    for dist in ("torch", "transformers", "nvidia-modelopt"):
        try:
            found[dist.replace("nvidia-", "")] = version(dist)
        except PackageNotFoundError:
            found[dist.replace("nvidia-", "")] = None
    return found


class Stages:
    """One status line per stage on stderr (stdout stays free for --json), with elapsed time."""

    def __init__(self, enabled: bool):
        self.console = None
        if enabled:
            self.console = Console(stderr=True)
        self.timings: dict[str, float] = {}
        self.peak_rss_mb: dict[str, int] = {}  # the process's peak RSS at the end of each stage (it never falls)

    @contextlib.contextmanager
    def stage(self, name: str, message: str, spinner: bool = True):
        """spinner=False for stages that draw their own progress bar (rich allows one live display)."""
        start = time.perf_counter()
        status = self.console.status(message) if self.console and spinner else contextlib.nullcontext()
        with status:
            yield
        self.timings[name] = round(time.perf_counter() - start, 3)
        self.peak_rss_mb[name] = peak_rss_mb()
        if self.console:
            self.console.print(f"[green]✓[/] {message} [dim]({self.timings[name]:.1f}s, peak RSS "
                               f"{self.peak_rss_mb[name] / 1024:.1f} GB)[/]")


def peak_rss_mb() -> int:
    """This process's peak resident set size so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
