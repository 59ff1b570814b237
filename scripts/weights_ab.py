"""Engines of one model with different weights (bf16, q8_0, GGUF blocks...) side by side: plain decoding's ms per
token, timed in turns (repeat by repeat, one process), and where each engine's greedy tokens first differ from the
first engine's.

    python scripts/weights_ab.py engines/smollm2-bf16 engines/smollm2-q8_0 engines/smollm2-q4_0 --threads 2

Machines here drift within minutes, so only the side-by-side ratio means much; `uptime`'s load says how shared the
CPU was.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from eagle_trt.prompt_sources import prompt_ids
from eagle_trt.runtime.session import Session

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain why the sky is blue in two sentences.",
           "List three uses of a hash map.",
           "What is the capital of France? Answer briefly."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engines", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sessions = {e: Session.open(e, verify=False) for e in args.engines}
    first = args.engines[0]
    prompts = [prompt_ids(sessions[first].tokenizer, p) for p in PROMPTS]
    texts = {e: [s.runner.generate(ids, s.decode_config(max_new_tokens=64, mode="ar")).token_ids for ids in prompts]
             for e, s in sessions.items()}
    ms = {e: [] for e in args.engines}
    for _ in range(args.repeats):
        for e, s in sessions.items():
            start = time.perf_counter()
            out = s.runner.generate(prompts[0], s.decode_config(max_new_tokens=args.tokens, mode="ar"))
            ms[e].append(1e3 * (time.perf_counter() - start) / len(out.token_ids))
    print(f"load average {os.getloadavg()[0]:.1f}, {args.threads} threads, {args.repeats} repeats of "
          f"{args.tokens} tokens")
    for e, s in sessions.items():
        parts = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(texts[e], texts[first])]
        same = sum(p is None for p in parts)
        print(f"{e}: weights {s.weights}, kernels {s.kernels}: ms/token min {min(ms[e]):.2f} median "
              f"{statistics.median(ms[e]):.2f}; greedy tokens equal to {first}'s on {same}/{len(parts)} prompts "
              f"(64 tokens; first differences at {[p for p in parts if p is not None]})")


if __name__ == "__main__":
    main()
