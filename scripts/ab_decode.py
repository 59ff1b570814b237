"""Two checkouts of eagle-trt side by side on one engine: same tokens? same tau? how fast?

    python scripts/ab_decode.py --engine engines/smollm2-135m-eagle3 --a /tmp/before --b . --repeats 5

Each side decodes every prompt of the set (the bench prompt sets: chat, code, ...) in its own process, with the
engine's own settings (tuned ones included, unless --untuned), `--mode eagle` and `--mode ar`; sides alternate A B A B ... so load
drift hits both alike. Reports per side and mode: whether every prompt's tokens equal the other side's, tau, and
tokens/s min / median over the repeats (each repeat's figure: all prompts' tokens over all prompts' seconds).
A refactor of the decode path should show identical tokens, identical tau and tokens/s within noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, sys, time
import eagle_trt
print("eagle_trt from", eagle_trt.__file__, file=sys.stderr)
from eagle_trt.bench.prompts import load_prompts
from eagle_trt.runtime.session import Session

engine, prompts, limit, new, tuned = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
session = Session.open(engine)
config = getattr(session, "decode_config", None) or getattr(session, "decode_options")
encoded = [p.encode(session.tokenizer)[-session.runner.max_input_len:] for p in load_prompts(prompts, limit or None)]
session.runner.generate(encoded[0], config(max_new_tokens=8))  # warm-up
out = {}
for mode in ("eagle", "ar"):
    opts = config(mode=mode, max_new_tokens=new) if tuned else config(tuned=False, mode=mode, max_new_tokens=new)
    tokens, steps, committed, seconds = [], 0, 0, 0.0
    for ids in encoded:
        t = time.perf_counter()
        r = session.runner.generate(ids, opts)
        seconds += time.perf_counter() - t
        tokens.append(r.token_ids)
        steps += r.metrics.verify_steps
        committed += sum(s.accepted + 1 for s in r.metrics.steps)
    out[mode] = {"tokens": tokens, "tau": committed / max(steps, 1),
                 "tok_s": sum(map(len, tokens)) / seconds}
print(json.dumps(out))
"""


def run_side(src: Path, args) -> dict:
    """One side's figures, in a process that imports that side's eagle_trt: it runs in the side's directory (with
    `-c` the working directory comes first on sys.path, before PYTHONPATH and any installed copy)."""
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    prompts = str(Path(args.prompts).resolve()) if Path(args.prompts).exists() else args.prompts
    cmd = [sys.executable, "-c", WORKER, str(args.engine.resolve()), prompts, str(args.limit),
           str(args.max_new_tokens), "0" if args.untuned else "1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=src.resolve())
    if done.returncode != 0:
        sys.exit(f"{src}: the worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--a", type=Path, required=True, help="checkout A (the baseline): a directory holding eagle_trt/")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--prompts", default="chat")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts (0 = all)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--untuned", action="store_true", help="the engine's build settings, its tuned.json left out")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for i in range(args.repeats):
        for side, src in (("A", args.a), ("B", args.b)):
            runs[side].append(run_side(src, args))
            print(f"repeat {i + 1}/{args.repeats} {side}: "
                  + ", ".join(f"{m} {runs[side][-1][m]['tok_s']:.2f} tok/s" for m in ("eagle", "ar")),
                  file=sys.stderr)
    report = {}
    for mode in ("eagle", "ar"):
        same = all(r[mode]["tokens"] == runs["A"][0][mode]["tokens"] for side in runs for r in runs[side])
        report[mode] = {"identical_tokens": same, **{side: {
            "tau": [round(r[mode]["tau"], 4) for r in rs],
            "tok_s_min": round(min(r[mode]["tok_s"] for r in rs), 2),
            "tok_s_median": round(statistics.median(r[mode]["tok_s"] for r in rs), 2)} for side, rs in runs.items()}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for mode, r in report.items():
        print(f"{mode}: tokens identical A/B: {r['identical_tokens']}; tau A {r['A']['tau']} B {r['B']['tau']}; "
              f"tok/s min/median A {r['A']['tok_s_min']}/{r['A']['tok_s_median']} "
              f"B {r['B']['tok_s_min']}/{r['B']['tok_s_median']}")


if __name__ == "__main__":
    main()
