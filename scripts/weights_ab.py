"""Engines of one model with different weights (bf16, q8_0, GGUF blocks...) side by side: plain decoding's ms per
token, timed in turns (repeat by repeat, one process), and where each engine's greedy tokens first differ from the
first engine's. `--compute float,int8` opens each block engine once per block compute mode (int8 activations or
fp32 de-quantized rows; `Session.open(block_compute=...)`), `--verify` adds each one's 16-token / 1-token forward
cost, the target weight bytes a token streams and the share of the copy-bandwidth roofline that decoding reaches.

    python scripts/weights_ab.py engines/smollm2-bf16 engines/smollm2-q8_0 engines/smollm2-q4_0 --threads 2
    python scripts/weights_ab.py engines/qwen-1.5b-gguf --compute float,int8 --verify --threads 2

Machines here drift within minutes, so only the side-by-side ratio means much; `uptime`'s load says how shared the
CPU was.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from eagle_trt.bench import roofline
from eagle_trt.prompt_sources import prompt_ids
from eagle_trt.runtime.session import Session

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain why the sky is blue in two sentences.",
           "List three uses of a hash map.",
           "What is the capital of France? Answer briefly."]


def open_all(engines: list[str], compute: list[str] | None) -> dict[str, Session]:
    """{label: session}: each engine, or each engine in each block compute mode (float engines once)."""
    out = {}
    for e in engines:
        first = Session.open(e, verify=False, block_compute=compute[0] if compute else None)
        if not compute or first.block_compute is None:
            out[e] = first
            continue
        out[f"{e} [{compute[0]}]"] = first
        for mode in compute[1:]:
            out[f"{e} [{mode}]"] = Session.open(e, verify=False, block_compute=mode)
    return out


def verify_figures(s: Session, ms_per_token: float, bandwidth: float) -> str:
    curve = roofline.forward_curve(s.runner.target, [1, 16], context=128, reps=5)
    weight = roofline.target_weight_bytes(s.runner.target)
    roof_ms = 1e3 * weight / bandwidth
    return (f"; 16-token / 1-token forward {curve[16] / curve[1]:.2f}x ({1e3 * curve[1]:.2f} / "
            f"{1e3 * curve[16]:.2f} ms); {weight / 1e6:.1f} MB a token, roofline {roof_ms:.2f} ms/token "
            f"({bandwidth / 1e9:.1f} GB/s copy): decoding at {100 * roof_ms / ms_per_token:.0f}% of it")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engines", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--compute", default=None, help="block compute modes to compare, e.g. float,int8")
    ap.add_argument("--verify", action="store_true", help="also the verify cost and the roofline share")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sessions = open_all(args.engines, args.compute.split(",") if args.compute else None)
    first = next(iter(sessions))
    prompts = [prompt_ids(sessions[first].tokenizer, p) for p in PROMPTS]
    texts = {e: [s.runner.generate(ids, s.decode_config(max_new_tokens=64, mode="ar")).token_ids for ids in prompts]
             for e, s in sessions.items()}
    ms = {e: [] for e in sessions}
    for _ in range(args.repeats):
        for e, s in sessions.items():
            start = time.perf_counter()
            out = s.runner.generate(prompts[0], s.decode_config(max_new_tokens=args.tokens, mode="ar"))
            ms[e].append(1e3 * (time.perf_counter() - start) / len(out.token_ids))
    bandwidth = roofline.copy_bandwidth(256) if args.verify else 0.0
    print(f"load average {os.getloadavg()[0]:.1f}, {args.threads} threads, {args.repeats} repeats of "
          f"{args.tokens} tokens")
    for e, s in sessions.items():
        parts = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(texts[e], texts[first])]
        same = sum(p is None for p in parts)
        extra = verify_figures(s, min(ms[e]), bandwidth) if args.verify else ""
        print(f"{e}: weights {s.weights}, block compute {s.block_compute}, kernels {s.kernels}: ms/token min "
              f"{min(ms[e]):.2f} median {statistics.median(ms[e]):.2f}; greedy tokens equal to {first}'s on "
              f"{same}/{len(parts)} prompts (64 tokens; first differences at {[p for p in parts if p is not None]})"
              f"{extra}")


if __name__ == "__main__":
    main()
