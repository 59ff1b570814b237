"""Measure a trained head's τ on convert's held-out prompts and write the head dir's report.json.

    python scripts/validate_head.py checkpoints/smollm2-135m-instruct heads/smollm2-135m-instruct \\
        --data data/code_answers.jsonl --data ... --training TRAINING.json

What `eagle-trt convert` does after training, for a head trained with `--no-validate` (on another
machine, say): the same --data files give the same 4 held-out prompts, decoded at T=0 for 64 new
tokens with a chain and a dynamic tree on CPU, as `convert` would. `--training` is a JSON file
holding convert's summary (its `--json` output); its "training" part is kept beside the result.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path, help="checkpoint dir with target/ and draft/ (the head to measure)")
    ap.add_argument("head", type=Path, help="head dir to write report.json into")
    ap.add_argument("--data", action="append", required=True, help="the --data files the head was trained on")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--val-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--training", type=Path, help="convert's --json summary of the training run")
    args = ap.parse_args()

    from eagle_trt.convert.data import build_dataset
    from eagle_trt.convert.validate import checkpoint_report, write_report
    from eagle_trt.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.checkpoint / "target")
    prompts = build_dataset(args.data, tokenizer, seq_len=args.seq_len, n_val=args.val_prompts,
                            progress=False).val_prompts
    training = json.loads(args.training.read_text())["training"] if args.training else None
    report = checkpoint_report(args.checkpoint, tokenizer, prompts, training, args.max_new_tokens)
    path = write_report(args.head, report)
    validation = report["validation"]
    print(json.dumps({k: v for k, v in validation.items() if k != "per_prompt"}, indent=1))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
