"""τ of an engine's head under each serving engine's computation, measured by eagle-trt's runtime (docs/interop.md).

    python scripts/interop_tau.py engines/smollm2-135m-eagle3 --prompts 8 --max-new-tokens 64

Greedy, prompt lookup off (the head alone), chain (draft_length 6) and the dynamic tree; the first N prompts of the
shipped chat set (eagle_trt/data/chat_prompts.jsonl); `eagle_trt/interop/tau.py` does the decoding. The computations
(`eagle_trt/interop/formats.py`):

- eagle-trt / modelopt: the feature normed twice (input_layernorm, then hidden_norm), the head's own layer ids.
- hidden_norm only (vLLM, SGLang, speculators, TensorRT-LLM): the same layers, the feature normed once.
- hidden_norm only, ids read as-is by a capture-before-layer engine: what vLLM computed from the config eagle-trt
  wrote before its export existed (ids [1, 14, 26] fed the outputs of layers 0, 13, 25).

The output stays token-identical to plain greedy under every computation (checked); only τ moves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", type=Path)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--output", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    from eagle_trt.interop.tau import measure_computations

    draft = json.loads((args.engine / "draft" / "config.json").read_text())
    ours = draft.get("eagle_aux_hidden_state_layer_ids") or draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cases = {
        "eagle-trt / modelopt (double norm)": (True, ours),
        "hidden_norm only (vLLM, SGLang, speculators, TensorRT-LLM)": (False, ours),
        "hidden_norm only, ids unshifted (vLLM on the pre-export config)": (False, [i - 1 for i in ours]),
    }
    results = {"engine": str(args.engine), "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
               "aux_layer_ids": ours,
               "cases": measure_computations(args.engine, cases, args.prompts, args.max_new_tokens)}
    for name, r in results["cases"].items():
        print(name, r)
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
