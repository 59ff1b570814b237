"""Wall-clock timing shared by the benchmarks and the runtime's own measurements (no layer imports it needs)."""

from __future__ import annotations

import statistics
import time


def sample_seconds(fn, reps: int, warmup: int = 1) -> list[float]:
    """Wall times of `fn()` over `reps` calls, after `warmup` untimed calls (first-touch pages, scratch)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def median_seconds(fn, reps: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` over `reps` calls, after `warmup` untimed calls."""
    return statistics.median(sample_seconds(fn, reps, warmup))


def best_seconds(fn, reps: int, warmup: int = 1) -> float:
    """Fastest wall time of `fn()` over `reps` calls, after `warmup` untimed calls: for a ceiling (a bandwidth),
    which other work on a shared machine can only lower."""
    return min(sample_seconds(fn, max(reps, 1), warmup))
