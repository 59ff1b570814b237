"""Run the decode tests round after round while CPU-bound processes compete for the cores: a test that passes here
does not hang on the machine's load (`make test-stress`; README, "Tests").

    python scripts/stress_tests.py                                  # 10 rounds of the decode tests, 4 burners
    python scripts/stress_tests.py --rounds 40 --burners 4 tests/test_copy_gate.py
    python scripts/stress_tests.py --clock jitter --rounds 3        # and a random clock instead of the wall clock
    python scripts/stress_tests.py --json                           # one JSON object on stdout, for CI

Each burner is a process spinning on arithmetic; it stops by itself at its deadline (--max-seconds), and the run
ends them as soon as the rounds are done. Every round is a fresh `pytest` process (fixtures, caches and the
runner's learned prices start anew, as in a real run). The exit code is 1 when any round failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from eagle_trt.cli.bench_serve_cmd import cpu_name

REPO = Path(__file__).resolve().parents[1]
# The tests whose decode policies read the clock: the copy gate, prompt lookup, continuous batching, the end of
# the context, and the server's batching.
DECODE_TESTS = ["tests/test_copy_gate.py", "tests/test_lookup.py", "tests/test_batch.py",
                "tests/test_step_budget.py", "tests/test_context_end.py", "tests/test_serve.py"]
SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped)")


def burn(deadline: float) -> None:
    """Spin on the CPU until the deadline (a monotonic time): a competing process that needs no supervision."""
    x = 1.0
    while time.monotonic() < deadline:
        for _ in range(100_000):
            x = x * 1.0000001 + 1e-9


def counts(output: str) -> dict[str, int]:
    """pytest's closing counts (passed, failed, error, skipped) from its last summary line."""
    lines = [line for line in output.splitlines() if SUMMARY.search(line)]
    out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for n, kind in SUMMARY.findall(lines[-1] if lines else ""):
        out["error" if kind == "errors" else kind] += int(n)
    return out


def run_round(tests: list[str], clock: str, seed: int, timeout: float, extra: list[str]) -> dict:
    env = {**os.environ, "EAGLE_TRT_TEST_CLOCK": clock, "EAGLE_TRT_TEST_CLOCK_SEED": str(seed)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *tests]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output, code = f"{e.stdout or ''}\nround timed out after {timeout:.0f} s", -1
    res = {"seconds": round(time.monotonic() - start, 1), "exit_code": code, **counts(output)}
    res["ok"] = code == 0 and res["failed"] == 0 and res["error"] == 0
    res["failures"] = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if not res["ok"] and not res["failures"]:
        res["failures"] = output.strip().splitlines()[-5:]
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tests", nargs="*", help=f"test files or node ids (default: {' '.join(DECODE_TESTS)})")
    p.add_argument("--rounds", type=int, default=10, help="pytest runs, one after another (default 10)")
    p.add_argument("--burners", type=int, default=4, help="CPU-bound processes beside them (default 4)")
    p.add_argument("--clock", choices=("wall", "jitter"), default="wall",
                   help="the clock the tests' components read: jitter = a seeded random one per round")
    p.add_argument("--max-seconds", type=float, default=3600.0,
                   help="the burners stop by themselves after this long, and no round starts after it")
    p.add_argument("--round-timeout", type=float, default=1200.0, help="a round running longer is a failure")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a line per round")
    p.add_argument("--pytest-args", default="", help="more pytest arguments, e.g. \"-k batch\"")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.burners < 0 or a.max_seconds <= 0:
        p.error("--rounds must be >= 1, --burners >= 0 and --max-seconds > 0")
    tests = a.tests or DECODE_TESTS
    start = time.monotonic()
    deadline = start + a.max_seconds
    burners = [multiprocessing.Process(target=burn, args=(deadline,), daemon=True) for _ in range(a.burners)]
    for b in burners:
        b.start()
    rounds = []
    try:
        for i in range(a.rounds):
            if time.monotonic() >= deadline:
                break
            res = run_round(tests, a.clock, i, min(a.round_timeout, deadline - time.monotonic() + 60),
                            a.pytest_args.split())
            rounds.append(res)
            if not a.json:
                state = "ok" if res["ok"] else "FAILED"
                print(f"round {i + 1}/{a.rounds}: {state}  {res['passed']} passed, {res['failed']} failed, "
                      f"{res['error']} errors in {res['seconds']} s", flush=True)
                for line in res["failures"]:
                    print(f"    {line}", flush=True)
    finally:
        for b in burners:
            b.terminate()
        for b in burners:
            b.join(5)
    summary = {"cpu": cpu_name(), "cores": os.cpu_count(), "burners": a.burners, "clock": a.clock, "tests": tests,
               "rounds": len(rounds), "rounds_ok": sum(r["ok"] for r in rounds),
               "tests_passed": sum(r["passed"] for r in rounds), "tests_failed": sum(r["failed"] for r in rounds),
               "tests_errors": sum(r["error"] for r in rounds), "seconds": round(time.monotonic() - start, 1),
               "load_average": os.getloadavg(), "per_round": rounds}
    if a.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"stress: {summary['rounds_ok']} of {summary['rounds']} rounds green ({summary['tests_passed']} test "
              f"runs passed, {summary['tests_failed']} failed, {summary['tests_errors']} errors) with "
              f"{a.burners} CPU-bound processes beside them, clock {a.clock}, {summary['cores']} cores, "
              f"{summary['cpu']}, {summary['seconds']} s")
    return 0 if summary["rounds_ok"] == len(rounds) == a.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
