"""Wall-clock timing shared by the benchmarks and the runtime's own measurements (no layer imports it needs).

Every reading of the time that a decision depends on (the copy gate's row price and token worth, the batch's mode
chooser, the verify-cost curve, tune's and bench's measurements) goes through a `Clock`: a callable returning
seconds. Production code takes `now` by default; a test pins the decisions by passing a `TickClock`, whose
intervals count readings instead of elapsed time, so a loaded machine decides exactly as a quiet one.

    runner = Runner(target, head, capacity=512, clock=TickClock())   # the same step records under any load
    median_seconds(fn, reps=5)                                       # the wall clock
    EAGLE_TRT_CLOCK=tick eagle-trt run ...    # a process whose decode decisions repeat run after run (debugging)
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

from eagle_trt.errors import InputError

CLOCK_ENV = "EAGLE_TRT_CLOCK"

Clock = Callable[[], float]  # seconds; only differences between two readings mean anything


def now() -> float:
    """The wall clock: `time.perf_counter()`. Components read it through this name (or the clock they were given),
    never through `time` directly, so the test suite can swap it for a whole run (tests/conftest.py, --clock)."""
    return time.perf_counter()


class TickClock:
    """A clock whose every reading is `tick` seconds after the one before: a measured interval is the number of
    readings it spans times `tick`, a function of the code path alone, never of the machine's load.

    >>> c = TickClock(tick=0.5)
    >>> c(), c(), c()
    (0.5, 1.0, 1.5)
    """

    def __init__(self, tick: float = 1e-3, start: float = 0.0):
        if not tick > 0:
            raise ValueError(f"TickClock tick must be > 0, got {tick}")
        self.tick, self.t = tick, start

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def decision_clock() -> Clock | None:
    """The clock `EAGLE_TRT_CLOCK` names for an engine's decode decisions: `tick` (a `TickClock`: the copy gate,
    the step budget and the tree cut decide the same way on every run, whatever the load; the step times
    they report are then counts, not seconds), `wall` or unset (None: the wall clock)."""
    name = os.environ.get(CLOCK_ENV, "wall").strip().lower()
    if name in ("", "wall"):
        return None
    if name == "tick":
        return TickClock()
    raise InputError(f"{CLOCK_ENV}={os.environ[CLOCK_ENV]!r} is not a clock: use 'wall' (the default) or 'tick'")


def clock_or_default(clock: Clock | None) -> Clock:
    """`clock`, or the module's current `now` (looked up at call time, so a swapped `now` reaches every caller)."""
    return clock if clock is not None else now


def sample_seconds(fn, reps: int, warmup: int = 1, clock: Clock | None = None) -> list[float]:
    """Wall times of `fn()` over `reps` calls, after `warmup` untimed calls (first-touch pages, scratch)."""
    clock = clock_or_default(clock)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = clock()
        fn()
        times.append(clock() - t)
    return times


def median_seconds(fn, reps: int, warmup: int = 1, clock: Clock | None = None) -> float:
    """Median wall time of `fn()` over `reps` calls, after `warmup` untimed calls."""
    return statistics.median(sample_seconds(fn, reps, warmup, clock))


def best_seconds(fn, reps: int, warmup: int = 1, clock: Clock | None = None) -> float:
    """Fastest wall time of `fn()` over `reps` calls, after `warmup` untimed calls: for a ceiling (a bandwidth),
    which other work on a shared machine can only lower."""
    return min(sample_seconds(fn, max(reps, 1), warmup, clock))
