"""Time a whole `eagle-trt run` process against the floor every run pays (the interpreter and `import torch`), side by
side in one session, and read its peak RSS against the engine's weight bytes.

    python scripts/cold_start.py --engine engines/smollm2-135m-eagle3 --repeats 5
    python scripts/cold_start.py --engine engines/qwen15 --repeats 3 --json > cold.json

Each repeat runs, in turn: `python -c 'import torch'`, then `eagle-trt run --engine E --prompt Hi --max-new-tokens 8`
(a fresh process each; wall time and peak RSS from the kernel's accounting of the child). With --cold-layout the
engine's runtime weight layout is also made from scratch once (a private, empty weight cache), which is what the
first start on a new machine pays when `build` did not run there. Reports min and median over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one child process; raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss * 1024


def weight_bytes(engine: Path) -> int:
    return sum(p.stat().st_size for sub in ("target", "draft") for p in (engine / sub).glob("*.safetensors"))


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="passed to run --threads")
    ap.add_argument("--cold-layout", action="store_true", help="also time one start that makes the weight layout")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    run = [sys.executable, "-c", "from eagle_trt.cli.app import main; main()", "run", "--engine", str(args.engine),
           "--prompt", "Hi", "--max-new-tokens", "8", *(["--threads", str(args.threads)] if args.threads else [])]
    floor_cmd = [sys.executable, "-c", "import torch"]
    timed(run)  # a first run builds the kernels and the weight layout if this machine has neither yet
    floors, runs, rss = [], [], []
    for _ in range(args.repeats):
        floors.append(timed(floor_cmd)[0])
        wall, peak = timed(run)
        runs.append(wall)
        rss.append(peak)
    out = {"engine": str(args.engine), "repeats": args.repeats, "import_torch_s": summary(floors),
           "run_s": summary(runs), "run_over_import_torch": summary([r / f for r, f in zip(runs, floors)]),
           "run_peak_rss_bytes": max(rss), "engine_weight_bytes": weight_bytes(args.engine)}
    out["rss_over_weights"] = out["run_peak_rss_bytes"] / out["engine_weight_bytes"]
    if args.cold_layout:
        with tempfile.TemporaryDirectory() as empty:
            wall, peak = timed(run, env={**os.environ, "EAGLE_TRT_WEIGHT_CACHE": empty})
        out["cold_layout_run_s"], out["cold_layout_peak_rss_bytes"] = wall, peak
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"engine {out['engine']}: {out['engine_weight_bytes'] / 2**20:.0f} MiB of weights, {args.repeats} repeats")
    print(f"  import torch      {out['import_torch_s']['min']:.2f} s min, {out['import_torch_s']['median']:.2f} s median")
    print(f"  run (Hi, 8 tok)   {out['run_s']['min']:.2f} s min, {out['run_s']['median']:.2f} s median  "
          f"= {out['run_over_import_torch']['median']:.2f}x import torch (median of ratios)")
    print(f"  run peak RSS      {out['run_peak_rss_bytes'] / 2**20:.0f} MiB = {out['rss_over_weights']:.2f}x weights")
    if args.cold_layout:
        print(f"  first start, layout made: {out['cold_layout_run_s']:.2f} s, "
              f"{out['cold_layout_peak_rss_bytes'] / 2**20:.0f} MiB peak RSS")


if __name__ == "__main__":
    main()
