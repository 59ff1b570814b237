"""Wall-clock timing shared by the benchmarks and the runtime's own measurements (no layer imports it needs)."""

from __future__ import annotations

import statistics
import time


def median_seconds(fn, reps: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` over `reps` calls, after `warmup` untimed calls (first-touch pages, scratch)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
