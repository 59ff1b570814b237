"""The block projections' two compute modes side by side at one model's shapes: fp32 de-quantized rows (`float`) and
int8 activations (`int8`), one row (a decode step) and 16 rows (a verify pass), timed in turns in one process, beside
a 256 MB `torch.sum` (the read bandwidth the weights stream at).

    python scripts/block_kernel_ab.py --threads 1                 # Qwen2.5-1.5B shapes, q4_k and q6_k
    python scripts/block_kernel_ab.py --shapes q4_0:1536x576,q8_0:49152x576 --threads 2

Weights are random blocks (tests/test_native_blocks.py's `random_blocks`). Machines here drift within minutes, so
only the side-by-side ratios mean much.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from eagle_trt.models import native  # noqa: E402
from eagle_trt.models.native.block_gemm import BlockProjection  # noqa: E402
from test_native_blocks import random_blocks  # noqa: E402

QWEN15 = "q4_k:17920x1536,q4_k:2048x1536,q6_k:1536x8960,q6_k:37984x1536"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=QWEN15, help="format:OUTxIN,...")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lib = native.library()
    cases = []
    for spec in args.shapes.split(","):
        fmt, dims = spec.split(":")
        n, k = (int(v) for v in dims.split("x"))
        w = random_blocks(fmt, n, k, seed=1)
        cases.append((spec, w.nbytes, {c: BlockProjection(lib, w, c) for c in ("float", "int8")}, k))
    big, read = torch.ones(1 << 26), []
    times = {(s, c, m): [] for s, _, projs, _ in cases for c in projs for m in (1, 16)}
    xs = {(k, m): torch.randn(m, k) for *_, k in cases for m in (1, 16)}
    for _ in range(args.repeats):
        t = time.perf_counter()
        big.sum()
        read.append(big.numel() * 4 / (time.perf_counter() - t))
        for spec, _, projs, k in cases:
            for c, p in projs.items():
                for m in (1, 16):
                    t = time.perf_counter()
                    p(xs[k, m])
                    times[spec, c, m].append(time.perf_counter() - t)
    print(f"load average {os.getloadavg()[0]:.1f}, {args.threads} threads, int8 dot {lib.int8_dot()}, min of "
          f"{args.repeats}; torch.sum reads at {max(read) / 1e9:.1f} GB/s")
    for spec, nbytes, projs, _ in cases:
        line = [f"{spec} ({nbytes / 1e6:.1f} MB):"]
        for c in projs:
            one, sixteen = min(times[spec, c, 1]), min(times[spec, c, 16])
            line.append(f"{c} {1e3 * one:.3f} ms ({nbytes / one / 1e9:.1f} GB/s), 16 rows {1e3 * sixteen:.3f} ms "
                        f"({sixteen / one:.1f}x);")
        print(" ".join(line))


if __name__ == "__main__":
    main()
