"""Where a decode step's time goes, for plain AR and the engine's (tuned) speculative setting, side by side.

    python scripts/profile_decode.py --engine engines/smollm2-135m-eagle3-bf16 --prompts humaneval --limit 6
    # another speculative setting than the engine's: any DecodeOptions field
    python scripts/profile_decode.py --engine E --set total_tokens=4 --set lookup_tokens=12 --set max_verify_rows=0

Prints, per method: tokens/s, ms per step, the draft and verify ms inside a step (the rest is
bookkeeping), and for the speculative run the verify rows per step (mean, p90, max, the share above one
32-row bf16 chunk). Then the torch profiler's top operators for plain AR on the first prompt, with the
share of matrix products: the part of a token that moves weights; the rest is per-op overhead.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--set", action="append", default=[], help="name=value: a DecodeOptions field (int or float)")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from eagle_trt.bench.prompts import load_prompts
    from eagle_trt.models.gemm import INVARIANT_ROWS
    from eagle_trt.runtime.session import Session

    torch.set_num_threads(args.threads)
    session = Session.open(args.engine)
    runner = session.runner
    encoded = [p.encode(session.tokenizer) for p in load_prompts(args.prompts, args.limit)]
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = float(value) if "." in value else int(value)
    label = "eagle (" + (", ".join(args.set) or "engine defaults") + ")"
    runs = {"ar": session.decode_options(mode="ar", max_new_tokens=args.max_new_tokens),
            label: session.decode_options(max_new_tokens=args.max_new_tokens, **overrides)}
    runner.generate(encoded[0], runs[label])  # warm-up
    for name, opts in runs.items():
        tokens = steps = 0
        draft = verify = elapsed = 0.0
        rows: list[int] = []
        for ids in encoded:
            t = time.perf_counter()
            m = runner.generate(ids, opts).metrics
            elapsed += time.perf_counter() - t - m.prefill_s
            tokens += m.generated_tokens - 1  # the prefill's token is not a step's
            steps += len(m.steps)
            draft += sum(s.draft_s for s in m.steps)
            verify += sum(s.verify_s for s in m.steps)
            rows += [s.tree_size + 1 for s in m.steps]
        line = (f"{name}: {tokens / elapsed:.1f} tok/s, {steps} steps, {1e3 * elapsed / steps:.1f} ms/step "
                f"(draft {1e3 * draft / steps:.1f}, verify {1e3 * verify / steps:.1f})")
        if opts.mode == "eagle":
            rows.sort()
            over = sum(r > INVARIANT_ROWS for r in rows) / len(rows)
            line += (f"; verify rows mean {sum(rows) / len(rows):.1f}, p90 {rows[int(0.9 * len(rows))]}, "
                     f"max {rows[-1]}, {100 * over:.0f}% of steps above {INVARIANT_ROWS}")
        print(line, flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        m = runner.generate(encoded[0], runs["ar"]).metrics
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemm = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "mkldnn::_linear_pointwise"))
    per_token = 1e3 * (m.total_s - m.prefill_s) / max(len(m.steps), 1)
    print(f"plain AR under the profiler: {per_token:.1f} ms/token; matrix products {100 * gemm / total:.0f}% of "
          f"operator time ({gemm / 1e3 / max(len(m.steps), 1):.1f} ms/token)")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
