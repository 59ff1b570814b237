"""τ of an engine's head under each serving engine's computation, measured by eagle-trt's runtime (docs/interop.md).

    python scripts/interop_tau.py engines/smollm2-135m-eagle3 --prompts 8 --max-new-tokens 64

Greedy, prompt lookup off (the head alone), chain (draft_length 6) and the dynamic tree; the first N prompts of the
shipped chat set (eagle_trt/data/chat_prompts.jsonl). The computations (`eagle_trt/interop/formats.py`):

- eagle-trt / modelopt: the feature normed twice (input_layernorm, then hidden_norm), the head's own layer ids.
- hidden_norm only (vLLM, SGLang, speculators, TensorRT-LLM): the same layers, the feature normed once.
- hidden_norm only, ids read as-is by a capture-before-layer engine: what vLLM computed from the config eagle-trt
  wrote before its export existed (ids [1, 14, 26] fed the outputs of layers 0, 13, 25).

The output stays token-identical to plain greedy under every computation (checked here); only τ moves.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", type=Path)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--output", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    from eagle_trt.runtime.session import Session

    session = Session.open(args.engine)
    runner, head = session.runner, session.runner.drafter.head
    rows = [json.loads(line) for line in
            (resources.files("eagle_trt") / "data" / "chat_prompts.jsonl").read_text().splitlines() if line.strip()]
    prompts = [session.encode(r["messages"][0]["content"]) for r in rows[: args.prompts]]
    ours = list(runner.aux_layers)
    plain = [runner.generate(p, session.decode_config(max_new_tokens=args.max_new_tokens, mode="ar")).token_ids
             for p in prompts]
    cases = {
        "eagle-trt / modelopt (double norm)": (True, ours),
        "hidden_norm only (vLLM, SGLang, speculators, TensorRT-LLM)": (False, ours),
        "hidden_norm only, ids unshifted (vLLM on the pre-export config)": (False, [i - 1 for i in ours]),
    }
    results = {"engine": str(args.engine), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
               "aux_layer_ids": ours, "cases": {}}
    for name, (prenorm, ids) in cases.items():
        head.hidden_prenorm, runner.aux_layers = prenorm, ids
        results["cases"][name] = {"aux_layers_fed": ids}
        for tree in ("chain", "dynamic"):
            committed = steps = 0.0
            for p, want in zip(prompts, plain):
                cfg = session.decode_config(max_new_tokens=args.max_new_tokens, tree=tree, lookup_tokens=0)
                out = runner.generate(p, cfg)
                assert out.token_ids == want, f"{name}/{tree}: output differs from plain greedy"
                committed += out.metrics.acceptance_length * out.metrics.verify_steps
                steps += out.metrics.verify_steps
            results["cases"][name][tree] = round(committed / steps, 3)
        print(name, results["cases"][name], flush=True)
    head.hidden_prenorm, runner.aux_layers = True, ours
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
