"""Sweep decoding settings on one engine, side by side with plain decoding in the same run.

    # confidence_threshold: tree size, tau and tokens/s (greedy)
    python scripts/sweep.py --engine engines/smollm2-135m-eagle3 --set confidence_threshold=0,0.001,0.01,0.05,0.2
    # sampling: eagle vs AR at T=0.7 and T=1.0
    python scripts/sweep.py --engine engines/smollm2-135m-eagle3 --set temperature=0.7,1.0 --with-ar
    # several fields at once are zipped: (32, 8, 6), then (16, 4, 5)
    python scripts/sweep.py --engine E --set total_tokens=32,16 --set beam_width=8,4 --set draft_length=6,5
    # prompt lookup on the bench's HumanEval prompts (sent as the bench sends them)
    python scripts/sweep.py --engine E --prompts humaneval --limit 6 --set lookup_tokens=0,8,8 \
        --set lookup_branches=1,1,2 --with-ar --repeats 1 --max-new-tokens 128

Each setting runs every prompt `--repeats` times (seeded) over the engine's defaults (tuned ones included);
the table shows mean tau, mean tree size and min/median tokens/s (over prompts x repeats), and with
--with-ar the AR run under the same setting.
"""

from __future__ import annotations

import argparse
import json
import statistics

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain how a hash table works in a few sentences.",
    "Write a short poem about autumn leaves.",
    "Give me three tips for writing clean code.",
]


def parse_set(spec: str) -> tuple[str, list]:
    name, _, values = spec.partition("=")
    return name.replace("-", "_"), [json.loads(v) for v in values.split(",")]


def run_setting(session, encoded, overrides, repeats, max_new_tokens):
    taus, sizes, speeds, rows = [], [], [], []
    for i, ids in enumerate(encoded):
        for r in range(repeats):
            opts = session.decode_config(max_new_tokens=max_new_tokens, seed=1000 * i + r, **overrides)
            m = session.runner.generate(ids, opts).metrics.to_dict()
            taus.append(m["acceptance_length"])
            sizes.append(m["mean_tree_size"])
            speeds.append(m["tokens_per_second"])
            rows.append(m)
    return {
        "tau": round(statistics.mean(taus), 3),
        "tree_size": round(statistics.mean(sizes), 2),
        "min_tps": round(min(speeds), 2),
        "median_tps": round(statistics.median(speeds), 2),
        "fallbacks": sum(m["fallbacks"] for m in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--set", required=True, action="append",
                    help="name=v1,v2,... a DecodeConfig field and its values; repeat to zip several fields")
    ap.add_argument("--with-ar", action="store_true", help="also run plain decoding under each setting")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--prompts", default=None,
                    help="chat, humaneval or a .jsonl file, as for `eagle-trt bench` (default: four built-in chats)")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from eagle_trt.runtime.session import Session

    session = Session.open(args.engine)
    sets = [parse_set(spec) for spec in args.set]
    if len({len(values) for _, values in sets}) != 1:
        raise SystemExit("every --set needs the same number of values")
    name = "/".join(n for n, _ in sets)
    settings = [dict(zip([n for n, _ in sets], combo)) for combo in zip(*[v for _, v in sets])]
    if args.prompts:
        from eagle_trt.bench.prompts import load_prompts

        encoded = [p.encode(session.tokenizer) for p in load_prompts(args.prompts, args.limit)]
    else:
        encoded = [session.encode(p) for p in PROMPTS[: args.limit]]
    session.runner.generate(encoded[0], session.decode_config(max_new_tokens=8))  # warm-up
    table = Table(title=f"sweep of {name} ({len(encoded)} prompts x {args.repeats}, {args.max_new_tokens} tokens)")
    for col in (name, "tau", "tree size", "tok/s min", "tok/s median", "AR tok/s median", "speedup"):
        table.add_column(col, justify="right")
    results = []
    for setting in settings:
        value = "/".join(str(v) for v in setting.values())
        res = {**setting, "eagle": run_setting(session, encoded, setting, args.repeats, args.max_new_tokens)}
        if args.with_ar:
            res["ar"] = run_setting(session, encoded, {**setting, "mode": "ar"}, args.repeats, args.max_new_tokens)
        e, a = res["eagle"], res.get("ar")
        speedup = f"{e['median_tps'] / a['median_tps']:.2f}x" if a else "-"
        table.add_row(str(value), f"{e['tau']:.2f}", f"{e['tree_size']:.1f}", f"{e['min_tps']:.1f}",
                      f"{e['median_tps']:.1f}", f"{a['median_tps']:.1f}" if a else "-", speedup)
        results.append(res)
    Console().print(table)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
