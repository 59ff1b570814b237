"""The one clock (eagle_trt/timing.py): every timing a decode policy reads comes from the clock its runner was given,
so a test that passes a `TickClock` gets the same decisions on a loaded machine as on a quiet one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.errors import InputError
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.runner import Runner
from eagle_trt.timing import CLOCK_ENV, TickClock, decision_clock, median_seconds, sample_seconds

PACKAGE = Path(__file__).resolve().parents[1] / "eagle_trt"


def test_a_tick_clock_counts_readings():
    c = TickClock(tick=0.25, start=1.0)
    assert [c(), c(), c()] == [1.25, 1.5, 1.75]
    assert sample_seconds(lambda: None, reps=3, clock=TickClock(0.5)) == [0.5, 0.5, 0.5]
    assert median_seconds(lambda: None, reps=3, clock=TickClock(2.0)) == 2.0
    with pytest.raises(ValueError, match="tick must be > 0"):
        TickClock(0)


def test_the_environment_names_the_decision_clock(monkeypatch):
    monkeypatch.delenv(CLOCK_ENV, raising=False)
    assert decision_clock() is None
    monkeypatch.setenv(CLOCK_ENV, "wall")
    assert decision_clock() is None
    monkeypatch.setenv(CLOCK_ENV, "Tick")
    assert isinstance(decision_clock(), TickClock)
    monkeypatch.setenv(CLOCK_ENV, "sundial")
    with pytest.raises(InputError, match="EAGLE_TRT_CLOCK='sundial' is not a clock: use 'wall'"):
        decision_clock()


@pytest.fixture(scope="module")
def parts(tiny_model_dir, tiny_head_dir):
    target = LlamaTarget.load(tiny_model_dir)
    return target, Eagle3DraftHead.load(tiny_head_dir, target)


def _run(parts, clock):
    target, head = parts
    runner = Runner(target, head, capacity=512, clock=clock)
    cfg = DecodeConfig(tree="dynamic", beam_width=2, draft_length=2, total_tokens=3, lookup_tokens=6,
                       lookup_branches=2, max_new_tokens=80, eos_token_ids=[])
    # Several requests: the row price is the runner's, learned across them, and the gate reads it once learned.
    return [runner.generate(p, cfg) for p in ([5, 6, 7, 8, 9] * 3, [100, 20, 30, 40] * 2, [7, 7, 7, 7, 7, 8])]


def test_every_time_a_runner_reads_is_its_clocks(parts):
    """With a TickClock every step's times are whole ticks (no wall time leaks in), and two fresh runners decide
    every step alike: the same copies verified, the same tree sizes, the same prices."""
    tick = 0.5
    first, second = _run(parts, TickClock(tick)), _run(parts, TickClock(tick))
    for res in first:
        m = res.metrics
        for t in [m.prefill_s, m.total_s] + [s.verify_s for s in m.steps] + [s.draft_s for s in m.steps]:
            assert t / tick == pytest.approx(round(t / tick)), t
    records = lambda runs: [[(s.accepted, s.tree_size, s.lookup_size, s.draft_s, s.verify_s)  # noqa: E731
                             for s in r.metrics.steps] for r in runs]
    assert records(first) == records(second)
    assert sum(s.lookup_size for r in first for s in r.metrics.steps) > 0


def test_no_component_reads_the_time_around_its_clock():
    """Decode policies and measurements read `eagle_trt.timing` (or the clock they were given), never `time`
    directly. Left alone: wall-clock deadlines of processes and files (`time.monotonic` for a subprocess's or a
    shutdown's deadline, `time.time` for file ages and the API's `created` stamps), which decide nothing about
    decoding."""
    allowed = {
        "eagle_trt/timing.py": {"perf_counter"},
        "eagle_trt/bench/serve_load.py": {"monotonic"},  # a server subprocess's start-up deadline
    }
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if not rel.startswith(("eagle_trt/runtime/", "eagle_trt/speculative/", "eagle_trt/bench/",
                               "eagle_trt/serve/", "eagle_trt/timing.py")):
            continue
        used = set(re.findall(r"\btime\.(perf_counter|monotonic|process_time|time_ns|time)\(", path.read_text()))
        used -= {"time"} if rel.startswith("eagle_trt/serve/") else set()  # `created` stamps
        if used - allowed.get(rel, set()):
            found[rel] = sorted(used - allowed.get(rel, set()))
    assert found == {}
