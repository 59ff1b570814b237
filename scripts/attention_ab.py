"""What the row-invariant attention kernel buys end to end: the same engine, prompts and settings, decoded with the
kernel and with the attention the engine would use without it, interleaved prompt by prompt in one process (the
machine's speed drifts, so only side-by-side numbers mean anything).

    python scripts/attention_ab.py --engine engines/smollm2-135m-eagle3-bf16 --prompts humaneval --limit 6

Prints, per attention: plain AR and the engine's (tuned) speculative setting in tok/s, their ratio, and how many
speculative outputs differed from AR (must be 0 for bf16; fp32 engines use SDPA, whose rows may differ from
decoding in the last bit, so the kernel runs there only for this comparison).
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from eagle_trt.bench.prompts import load_prompts
    from eagle_trt.models import native_attention
    from eagle_trt.models.layers import attention, attention_fp64
    from eagle_trt.runtime.session import Session

    torch.set_num_threads(args.threads)
    kernel = native_attention.load()
    if kernel is None:
        raise SystemExit("the kernel is unavailable here (needs a C++ compiler and EAGLE_TRT_NATIVE unset)")
    session = Session.open(args.engine)
    runner, target = session.runner, session.runner.target
    # The kernel against what the engine uses without it: float64 for bf16, torch's fused SDPA for fp32.
    fallback = ("float64", attention_fp64) if target.dtype == torch.bfloat16 else ("sdpa", attention)
    variants = {"kernel": kernel, fallback[0]: fallback[1]}
    spec = session.decode_options(max_new_tokens=args.max_new_tokens)
    ar = session.decode_options(mode="ar", max_new_tokens=args.max_new_tokens)
    prompts = [p.encode(session.tokenizer) for p in load_prompts(args.prompts, args.limit)]
    totals = {name: [0.0, 0.0, 0, 0, 0] for name in variants}  # ar s, spec s, ar tokens, spec tokens, mismatches
    for _ in range(args.repeats):
        for ids in prompts:
            for name, attend in variants.items():
                target.attend = attend
                a, b = runner.generate(ids, ar), runner.generate(ids, spec)
                t = totals[name]
                t[0] += a.metrics.total_s
                t[1] += b.metrics.total_s
                t[2] += len(a.token_ids)
                t[3] += len(b.token_ids)
                t[4] += a.token_ids != b.token_ids
    for name, (ta, tb, na, nb, bad) in totals.items():
        print(f"{name:8} ar {na / ta:5.1f} tok/s   speculative {nb / tb:5.1f} tok/s   ratio {nb / tb / (na / ta):.2f}x"
              f"   outputs differing from ar: {bad}")


if __name__ == "__main__":
    main()
