"""Where a decode step's time goes, for plain AR and the engine's (tuned) speculative setting, side by side.

    python scripts/profile_decode.py --engine engines/smollm2-135m-eagle3-bf16 --prompts humaneval --limit 6
    # another speculative setting than the engine's: any DecodeConfig field
    python scripts/profile_decode.py --engine E --set total_tokens=4 --set lookup_tokens=12 --set max_verify_rows=0

Prints, per method: tokens/s, ms per step, the draft and verify ms inside a step (the rest is
bookkeeping), and for the speculative run the verify rows per step (mean, p90, max, the share above the rows the
LM head scores in one pass over its weight). Then, for plain AR on the first prompt, the torch profiler's top
operators. The profiler sees torch operators only: the compiled kernels (each forward one call) run outside it;
`scripts/kernel_timings.py --parts` times their parts.
"""

from __future__ import annotations

import time

from decode_setup import decode_parser, open_session


def main() -> None:
    ap = decode_parser(__doc__)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--set", action="append", default=[], help="name=value: a DecodeConfig field (int or float)")
    args = ap.parse_args()

    from torch.profiler import ProfilerActivity, profile

    session, encoded = open_session(args)
    runner = session.runner
    per_pass = runner.target.lm_head_rows
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = float(value) if "." in value else int(value)
    label = "eagle (" + (", ".join(args.set) or "engine defaults") + ")"
    runs = {"ar": session.decode_config(mode="ar", max_new_tokens=args.max_new_tokens),
            label: session.decode_config(max_new_tokens=args.max_new_tokens, **overrides)}
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
            over = sum(r > per_pass for r in rows) / len(rows)
            line += (f"; verify rows mean {sum(rows) / len(rows):.1f}, p90 {rows[int(0.9 * len(rows))]}, "
                     f"max {rows[-1]}, {100 * over:.0f}% of steps above {per_pass}")
        print(line, flush=True)
    print(f"kernels: {session.kernels}")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.generate(encoded[0], runs["ar"])
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
