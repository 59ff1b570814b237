"""Engines of one target whose drafts differ (a head's q8_0 against q4_0 rows, say) side by side: speculative
decoding with the first engine's settings (tuned ones included) on every engine, and plain decoding on the first,
timed in turns prompt by prompt in one process. Reports per round and engine tokens/s and tau, and checks that every
engine's tokens equal plain decoding's.

    python scripts/draft_weights_ab.py engines/qwen2.5-coder-0.5b-eagle3 engines/qwen05-head-q4_0 \\
        --prompts chat,humaneval --limit 8 --rounds 3 --threads 2

Machines here drift within minutes: compare within a round, and say the load (`uptime`).
"""

from __future__ import annotations

import argparse
import time

import torch

from eagle_trt.bench.prompts import load_prompts
from eagle_trt.runtime.session import Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engines", nargs="+", help="engine dirs of one target; the first one's settings apply to all")
    ap.add_argument("--prompts", default="chat,humaneval", help="bench prompt sets, comma-separated")
    ap.add_argument("--limit", type=int, default=8, help="prompts per set")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    sessions = [Session.open(e) for e in args.engines]
    first = sessions[0]
    prompts = [p.encode(first.tokenizer) for name in args.prompts.split(",") for p in load_prompts(name, args.limit)]
    spec = first.decode_config(max_new_tokens=args.max_new_tokens)
    plain = first.decode_config(max_new_tokens=args.max_new_tokens, mode="ar")
    runs = [("ar", first, plain)] + [(e, s, spec) for e, s in zip(args.engines, sessions)]
    print(f"{len(prompts)} prompts; speculative settings: {spec.model_dump(exclude_defaults=True)}")
    for rnd in range(args.rounds):
        totals = {name: [0, 0.0, 0, 0] for name, _, _ in runs}  # tokens, seconds, committed, verify steps
        for ids in prompts:
            ref = None
            for name, session, cfg in runs:
                t = time.perf_counter()
                res = session.runner.generate(ids, cfg)
                m = res.metrics
                tot = totals[name]
                tot[0] += m.generated_tokens - 1  # the prefill's token is not a step's
                tot[1] += time.perf_counter() - t - m.prefill_s
                tot[2] += sum(s.accepted + 1 for s in m.steps)
                tot[3] += len(m.steps)
                if ref is None:
                    ref = res.token_ids
                elif res.token_ids != ref:
                    raise SystemExit(f"{name}: tokens differ from plain decoding's on a prompt: not lossless")
        line = ", ".join(f"{name}: {n / s:.1f} tok/s" + (f" (tau {c / k:.2f})" if name != "ar" else "")
                         for name, (n, s, c, k) in totals.items())
        print(f"round {rnd + 1}: {line}", flush=True)


if __name__ == "__main__":
    main()
