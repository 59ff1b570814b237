"""Sample user prompts from the target itself, for head training data that reads like the target's chats.

    python scripts/sample_chat_prompts.py checkpoints/smollm2-135m-instruct/target \\
        --output data/chat_sampled_prompts.jsonl --count 4000 --device cuda

The target gets its chat template up to the start of a user turn and writes the user's message
(sampling, temperature 1, top-p 0.95, up to 96 tokens); `regenerate_answers.py` then lets it answer
each one greedily. Kept: messages that end on their own, 16 to 600 characters, no special tokens,
no repeat (case-insensitive), and none sharing a run of 6 words with the bench's chat set (the same
held-out rule as `make_chat_prompts.py`, checked by tests/test_heldout.py). Each line is
`{"category": "sampled", "prompt": ...}`. Sampling is seeded per batch; on a GPU the draw can still
differ between runs, so the committed file, not this command, is the data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_chat_prompts import _bench_shingles, _shingles  # noqa: E402

MARK = "\u2063USER\u2063"


def user_turn(tokenizer) -> tuple[list[int], int]:
    """The chat template's tokens up to where the user's first message starts, and the token ending it."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                         add_generation_prompt=False)
    at = text.index(MARK)
    prefix = tokenizer(text[:at], add_special_tokens=False)["input_ids"]
    end = tokenizer(text[at + len(MARK):], add_special_tokens=False)["input_ids"]
    if not end:
        raise SystemExit("the chat template puts nothing after a user message: cannot tell where one ends")
    return prefix, end[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="HF model dir or .gguf")
    ap.add_argument("--output", required=True)
    ap.add_argument("--count", type=int, default=4000)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    args = ap.parse_args()

    import torch

    from eagle_trt.convert.device import resolve_device
    from eagle_trt.convert.load_target import load_target

    device = resolve_device(args.device)
    model, tokenizer, _ = load_target(args.target)
    model.to(device).eval()
    ids, eos = user_turn(tokenizer)
    prefix = torch.tensor([ids] * args.batch_size, device=device)
    bench = _bench_shingles()
    kept: dict[str, str] = {}
    t0, drawn = time.perf_counter(), 0
    for b in range(1000):
        if len(kept) >= args.count:
            break
        torch.manual_seed(args.seed * 1_000_003 + b)
        with torch.inference_mode():
            out = model.generate(input_ids=prefix, attention_mask=torch.ones_like(prefix), do_sample=True,
                                 temperature=1.0, top_p=0.95, top_k=0, max_new_tokens=args.max_new_tokens,
                                 pad_token_id=eos, eos_token_id=eos)
        for row in out[:, prefix.shape[1]:].cpu().tolist():
            drawn += 1
            if eos not in row:
                continue
            text = tokenizer.decode(row[: row.index(eos)], skip_special_tokens=False).strip()
            if not 16 <= len(text) <= 600 or "<|" in text or text.lower() in kept or _shingles(text) & bench:
                continue
            kept[text.lower()] = text
        print(f"batch {b}: {len(kept)} kept of {drawn} drawn", flush=True)
        if b >= 9 and len(kept) < drawn // 100:
            raise SystemExit(f"only {len(kept)} of {drawn} samples usable: check the chat template")
    rows = list(kept.values())[: args.count]
    out_path = Path(args.output)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for text in rows:
            f.write(json.dumps({"category": "sampled", "prompt": text}, ensure_ascii=False) + "\n")
    tmp.replace(out_path)
    print(f"{len(rows)} prompts from {drawn} samples in {time.perf_counter() - t0:.0f} s -> {out_path}")


if __name__ == "__main__":
    main()
