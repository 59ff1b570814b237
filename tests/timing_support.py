"""Clocks for the test suite (eagle_trt/timing.py is the runtime's one place to read the time).

`JitterClock` replaces the wall clock for a whole run (`pytest --clock jitter`): every reading advances by a random,
heavy-tailed amount, the way a loaded machine stretches some intervals a hundredfold. A test whose assertions
depend on the wall clock fails under it within a run or two; a test that pins its clock (`TickClock`) or asserts
only what timing cannot change passes. It is seeded, so a failure reproduces.
"""

from __future__ import annotations

import math
import random
import threading


class JitterClock:
    """Readings a random interval apart: ~1 ms times a load factor that drifts between 1 and 1000 (other processes
    coming and going), and one reading in ten a stall of up to 50 ms more."""

    def __init__(self, seed: int = 0):
        self._rng, self._lock, self.t, self._load = random.Random(seed), threading.Lock(), 0.0, 0.0

    def __call__(self) -> float:
        with self._lock:
            self._load = min(max(self._load + self._rng.gauss(0.0, 0.5), 0.0), 6.9)  # log of the factor
            step = self._rng.expovariate(1e3) * math.exp(self._load)
            if self._rng.random() < 0.1:
                step += self._rng.uniform(0.0, 0.05)
            self.t += step
            return self.t
