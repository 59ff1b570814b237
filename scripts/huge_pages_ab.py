"""Weights in huge pages against a file mapping (models/huge_pages.py), side by side on one engine.

    python scripts/huge_pages_ab.py --engine engines/qwen2.5-coder-1.5b-eagle3 --threads 2 --repeats 3

Each repeat opens the engine in a fresh process once per side (EAGLE_TRT_HUGE_PAGES=1, then 0: the weight cache's
layout read into an arena, or mapped), and times the open and --steps plain decode steps after a 100-token prefill,
each step split into the target's forward and the greedy token (LM head + argmax). Prints, per side, ms median (min)
over all steps of all repeats, and the opens' seconds. The engine's layout must be in the weight cache already
(`build` leaves it; a first `run` makes it), else both sides time a layout made in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from eagle_trt.runtime.session import Session
torch.set_num_threads(int(sys.argv[2]))
t1 = time.perf_counter()
s = Session.open(sys.argv[1], verify=False)
opened = time.perf_counter() - t1
target, cache = s.runner.target, s.runner.cache
ids = torch.arange(100) % 1000 + 10
with torch.inference_mode():
    target.hidden_states(ids, torch.arange(100), cache, need_aux=False, rows=torch.tensor([99]))
    cache.length, tok, forward, greedy = 100, 5, [], []
    for _ in range(int(sys.argv[3])):
        a = time.perf_counter()
        h, _ = target.hidden_states(torch.tensor([tok]), torch.tensor([cache.length]), cache, need_aux=False)
        b = time.perf_counter()
        tok = int(target.greedy(h)[0])
        greedy.append(time.perf_counter() - b)
        forward.append(b - a)
        cache.length += 1
print(json.dumps({"open_s": opened, "forward": forward, "greedy": greedy}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"1": [], "0": []}
    for r in range(args.repeats):
        for side in runs:
            env = dict(os.environ, EAGLE_TRT_HUGE_PAGES=side)
            out = subprocess.run([sys.executable, "-c", WORKER, args.engine, str(args.threads), str(args.steps)],
                                 env=env, capture_output=True, text=True, check=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"repeat {r + 1} huge pages {side}: open {runs[side][-1]['open_s']:.2f} s", file=sys.stderr)
    for side, label in (("1", "huge pages"), ("0", "file mapping")):
        parts = {}
        for key in ("forward", "greedy"):
            xs = [x for run in runs[side] for x in run[key]]
            parts[key] = f"{1e3 * statistics.median(xs):.2f} ({1e3 * min(xs):.2f})"
        steps = [f + g for run in runs[side] for f, g in zip(run["forward"], run["greedy"])]
        opens = [run["open_s"] for run in runs[side]]
        print(f"{label:12}  forward {parts['forward']}  greedy {parts['greedy']}  step "
              f"{1e3 * statistics.median(steps):.2f} ({1e3 * min(steps):.2f}) ms   open "
              + " ".join(f"{o:.2f}" for o in opens) + " s")


if __name__ == "__main__":
    main()
