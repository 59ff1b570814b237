"""Side-by-side decode speed on one engine: our plain AR, EAGLE (dynamic tree), and HF `generate` (fp32).

    python scripts/ar_vs_hf.py --engine engines/smollm2-135m-eagle3 --repeats 3

All three decode the same chat-templated prompt greedily in the same process; the script checks that
the three outputs are identical and prints min/median tokens/s over the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--prompt", default="Write a Python function that checks whether a number is prime.")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from eagle_trt.runtime.session import Session

    session = Session.open(args.engine)
    ids = session.encode(args.prompt)
    hf = AutoModelForCausalLM.from_pretrained(session.engine.target_dir, dtype=torch.float32).eval()
    eos = session.runner.target.spec.eos_token_ids

    def ours(mode):
        r = session.runner.generate(ids, session.decode_config(max_new_tokens=args.max_new_tokens, mode=mode))
        return r.token_ids, r.metrics.total_s

    def hf_generate():
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                              eos_token_id=eos or None)
        return out[0, len(ids):].tolist(), time.perf_counter() - t

    results = {}
    outputs = {}
    for name, fn in (("hf_generate", hf_generate), ("ar", lambda: ours("ar")), ("eagle", lambda: ours("eagle"))):
        fn()  # warm-up
        speeds = []
        for _ in range(args.repeats):
            toks, secs = fn()
            speeds.append(len(toks) / secs)
        outputs[name] = toks
        results[name] = {"tokens": len(toks), "min_tps": round(min(speeds), 2),
                         "median_tps": round(statistics.median(speeds), 2)}
    results["identical_outputs"] = outputs["ar"] == outputs["hf_generate"] == outputs["eagle"]
    results["ar_over_hf_median"] = round(results["ar"]["median_tps"] / results["hf_generate"]["median_tps"], 2)
    results["threads"] = torch.get_num_threads()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
