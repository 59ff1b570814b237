"""The int8 block projections' two paths side by side on an engine: the vector path (VNNI / AVX2 dot products) and the
AMX-INT8 tiles (csrc/gemm_int8_amx.cpp), as the target forward over T new rows costs with each (the verify-cost
curve), timed in turns in one process. Both paths give the same bits (tests/test_native_int8.py); this says what each
costs here.

    python scripts/int8_paths_ab.py engines/qwen15-q4 --threads 2 --rows 1,2,4,8,12,16,24,32 --repeats 5

Needs a CPU with AMX-INT8 (elsewhere only the vector path exists and the script says so). Machines here drift
within minutes: only the side-by-side ratios mean much, and `uptime`'s load says how shared the CPU was.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,4,8,12,16,24,32")
    ap.add_argument("--repeats", type=int, default=5, help="alternating passes; the minimum of each is reported")
    ap.add_argument("--context", type=int, default=128, help="tokens in the KV cache before the timed rows")
    args = ap.parse_args()

    from eagle_trt.models import native
    from eagle_trt.runtime.session import Session
    from eagle_trt.runtime.verify_cost import forward_curve

    torch.set_num_threads(args.threads)
    lib = native.library()
    if lib is None or not lib.int8_amx():
        sys.exit("no AMX-INT8 tiles here (or no compiled kernels): the vector path takes every call")
    session = Session.open(args.engine, verify=False)
    if session.block_compute != "int8":
        sys.exit(f"{args.engine}: its projections do not compute in int8 (block_compute {session.block_compute})")
    rows = [int(r) for r in args.rows.split(",")]
    paths = {"vector": 1 << 40, "tiles": 1}
    best: dict[tuple[str, int], float] = {}
    default = lib.int8_set_amx_rows(0)
    try:
        for _ in range(args.repeats):
            for name, threshold in paths.items():
                lib.int8_set_amx_rows(threshold)
                for t, s in forward_curve(session.runner.target, rows, context=args.context, reps=3).items():
                    best[name, t] = min(best.get((name, t), float("inf")), s)
    finally:
        lib.int8_set_amx_rows(default)
    one = best["vector", 1]
    print(f"{args.engine}: target forward over T rows, ms (min of {args.repeats}), and / the vector path's 1-row")
    print("| T | " + " | ".join(paths) + " | tiles / vector |")
    print("|---|" + "---|" * (len(paths) + 1))
    for t in rows:
        cells = " | ".join(f"{1e3 * best[p, t]:.1f} ({best[p, t] / one:.2f}x)" for p in paths)
        print(f"| {t} | {cells} | {best['tiles', t] / best['vector', t]:.2f} |")
    print(f"(the engine's own switch: tiles from {default} rows)")


if __name__ == "__main__":
    main()
