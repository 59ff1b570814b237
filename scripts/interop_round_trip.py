"""Export an engine's head to every format, import each back, and compare with the engine's own head: tensors, greedy
output and τ (docs/interop.md; `tests/test_interop_import.py` does the same on the tiny model).

    python scripts/interop_round_trip.py engines/smollm2-135m-eagle3 --prompts 4 --max-new-tokens 48

Runs on the engine's target and dtype with eagle-trt's runtime (torch backend engines), prompt lookup off.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from importlib import resources
from pathlib import Path


def decode(target, draft_dir, dtype, prompts, max_new_tokens):
    from eagle_trt.config.decode import DecodeConfig
    from eagle_trt.models.draft_head import Eagle3DraftHead
    from eagle_trt.runtime.runner import Runner

    runner = Runner(target, Eagle3DraftHead.load(draft_dir, target, dtype), capacity=1024, budget=False)
    outs = [runner.generate(p, DecodeConfig(max_new_tokens=max_new_tokens, lookup_tokens=0)) for p in prompts]
    steps = sum(o.metrics.verify_steps for o in outs)
    tau = sum(o.metrics.acceptance_length * o.metrics.verify_steps for o in outs) / steps
    return [o.token_ids for o in outs], round(tau, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", type=Path)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()

    import torch
    from safetensors.torch import load_file

    from eagle_trt.interop.export import export_head
    from eagle_trt.interop.formats import FORMATS
    from eagle_trt.interop.import_head import import_head
    from eagle_trt.models.llama import LlamaTarget
    from eagle_trt.prompt_sources import chat_ids
    from eagle_trt.tokenizer import load_tokenizer

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[
        json.loads((args.engine / "manifest.json").read_text())["dtype"]]
    target = LlamaTarget.load(args.engine / "target", dtype)
    tokenizer = load_tokenizer(args.engine / "tokenizer")
    rows = [json.loads(line) for line in
            (resources.files("eagle_trt") / "data" / "chat_prompts.jsonl").read_text().splitlines() if line.strip()]
    prompts = [chat_ids(tokenizer, r["messages"], add_generation_prompt=True) for r in rows[: args.prompts]]
    target_cfg = json.loads((args.engine / "target" / "config.json").read_text())
    want_tokens, want_tau = decode(target, args.engine / "draft", dtype, prompts, args.max_new_tokens)
    want = load_file(str(args.engine / "draft" / "model.safetensors"))
    print(f"engine's head: tau {want_tau}")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            export_head(args.engine, fmt, Path(tmp) / fmt)
            detected = import_head(Path(tmp) / fmt, Path(tmp) / f"{fmt}-back", target_cfg)
            got = load_file(str(Path(tmp) / f"{fmt}-back" / "model.safetensors"))
            same = set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
            tokens, tau = decode(target, Path(tmp) / f"{fmt}-back", dtype, prompts, args.max_new_tokens)
            print(f"{fmt}: detected {detected}, tensors identical {same}, greedy output identical "
                  f"{tokens == want_tokens}, tau {tau}")


if __name__ == "__main__":
    main()
