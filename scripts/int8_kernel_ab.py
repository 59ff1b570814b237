"""The int8 block projections (`block_compute: int8`) of this checkout beside another git revision's, side by side.

    python scripts/int8_kernel_ab.py --base d434211 --threads 2                  # the 1.5B's q4_k and q6_k shapes
    python scripts/int8_kernel_ab.py --base HEAD~1 --shapes q5_0:4864x896,q8_0:4864x896 --rows 1,3
    EAGLE_TRT_ISA=avx2 python scripts/int8_kernel_ab.py --base HEAD~1            # both built for AVX2

The base revision's kernels are compiled with this checkout's compiler and flags (scripts/kernel_ab.py's
build_revision); both libraries repack the same random blocks (tests/test_native_blocks.py's `random_blocks`) and
take turns, order reversed every other round, on the same inputs. Prints ms, the minimum over rounds of the mean of
--reps calls, the ratio to the base, and whether both gave the same bits (a change meant to keep them must).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from eagle_trt.models import native  # noqa: E402
from eagle_trt.models.native import bindings  # noqa: E402
from eagle_trt.models.native.block_gemm import BlockProjection  # noqa: E402
from kernel_ab import build_revision  # noqa: E402
from test_native_blocks import random_blocks  # noqa: E402

QWEN15 = "q4_k:8960x1536,q6_k:1536x8960,q4_k:2048x1536"


def mean_call(proj: BlockProjection, x: torch.Tensor, reps: int) -> float:
    proj(x)
    start = time.perf_counter()
    for _ in range(reps):
        proj(x)
    return (time.perf_counter() - start) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare this checkout with")
    ap.add_argument("--shapes", default=QWEN15, help="format:OUTxIN,...")
    ap.add_argument("--rows", default="1,2,3,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    this = native.library()
    if this is None:
        raise SystemExit(f"int8_kernel_ab: no native kernels here: {native.unavailable()}")
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"base": bindings.Library(build_revision(args.base, Path(tmp))), "this": this}
        rows = [int(r) for r in args.rows.split(",")]
        print(f"{args.threads} threads, kernels {this.isa_name}; ms, min of {args.rounds} rounds of {args.reps} calls")
        for spec in args.shapes.split(","):
            fmt, dims = spec.split(":")
            n, k = (int(v) for v in dims.split("x"))
            w = random_blocks(fmt, n, k, seed=1)
            projs = {name: BlockProjection(lib, w, "int8") for name, lib in libs.items()}
            for m in rows:
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
                same = torch.equal(projs["base"](x), projs["this"](x))
                best = {name: float("inf") for name in projs}
                for r in range(args.rounds):
                    for name in (list(projs) if r % 2 == 0 else list(projs)[::-1]):
                        best[name] = min(best[name], mean_call(projs[name], x, args.reps))
                print(f"{spec} {m:3} rows: base {1e3 * best['base']:.3f}  this {1e3 * best['this']:.3f} "
                      f"({best['this'] / best['base']:.2f}x)  same bits: {same}", flush=True)


if __name__ == "__main__":
    main()
