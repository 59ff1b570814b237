"""The int8 block projections' software prefetch distance (EAGLE_TRT_INT8_PREFETCH, csrc/gemm_int8.cpp), side by
side on one engine: the target forward over T new rows with each distance.

    python scripts/prefetch_ab.py --engine engines/qwen2.5-coder-1.5b-eagle3 --distances 0,2048,4096,8192 \
        --rows 1,2,4 --rounds 3

Each round runs one fresh process per distance, in turn (the variable is read once, when the kernels load), and
each times the forward after 128 cached tokens, the fastest of --reps calls per row count (a ceiling: another
process on a shared machine only slows a call). Prints ms, min over rounds, and each distance's ratio to the first.
Only calls the vector path takes change (fewer rows than the AMX tiles' threshold where the CPU has them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r"""
import json, sys, torch
from eagle_trt.runtime.session import Session
from eagle_trt.timing import best_seconds
torch.set_num_threads(int(sys.argv[2]))
target = Session.open(sys.argv[1], verify=False).runner.target
rows, reps = [int(r) for r in sys.argv[3].split(",")], int(sys.argv[4])
g = torch.Generator().manual_seed(0)
cache = target.new_cache(128 + max(rows) + 1)
target.forward(torch.randint(0, target.spec.vocab_size, (128,), generator=g), torch.arange(128), cache)
cache.length = 128
out = {}
with torch.inference_mode():
    for t in rows:
        tokens, positions = torch.randint(0, target.spec.vocab_size, (t,), generator=g), torch.arange(128, 128 + t)
        mask = torch.ones(t, t, dtype=torch.bool).tril_() if t > 1 else None
        out[t] = best_seconds(lambda: target.forward(tokens, positions, cache, mask), reps)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--distances", default="0,2048,4096,8192", help="bytes, comma-separated; 0 is no prefetch")
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    distances = [int(d) for d in args.distances.split(",")]
    best: dict[int, dict[str, float]] = {d: {} for d in distances}
    for r in range(args.rounds):
        for d in distances:
            env = dict(os.environ, EAGLE_TRT_INT8_PREFETCH=str(d))
            proc = subprocess.run([sys.executable, "-c", WORKER, args.engine, str(args.threads), args.rows,
                                   str(args.reps)], env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"distance {d}: the worker failed:\n{proc.stderr[-2000:]}")
            for t, s in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                best[d][t] = min(best[d].get(t, float("inf")), s)
            print(f"round {r + 1}, {d} bytes: " + "  ".join(f"{t}: {1e3 * s:.2f}" for t, s in best[d].items()),
                  file=sys.stderr)
    rows = list(best[distances[0]])
    print(f"{args.engine}: target forward over T rows, ms (min of {args.rounds} rounds), and / distance "
          f"{distances[0]}'s")
    print("| T | " + " | ".join(f"{d} bytes" for d in distances) + " |")
    print("|---|" + "---|" * len(distances))
    for t in rows:
        base = best[distances[0]][t]
        print(f"| {t} | " + " | ".join(f"{1e3 * best[d][t]:.2f} ({best[d][t] / base:.2f}x)" for d in distances) + " |")


if __name__ == "__main__":
    main()
