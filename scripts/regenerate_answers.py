"""Let the target answer a prompt file once and save the answers, so head training can reuse them.

    python scripts/regenerate_answers.py checkpoints/smollm2-135m-instruct/target \\
        data/code_prompts.jsonl --output data/code_answers.jsonl --max-new-tokens 192 [--shard 0/2]

Reads anything `convert --data` reads, answers every record that has a prompt (greedy, batched, the
same code `convert --regenerate` runs) and writes one line per answered record: the input row plus
`"response"` and `"eos"` (false when the answer stopped at --max-new-tokens). `convert --data
ANSWERS.jsonl` then trains on them without regenerating. `--shard i/n` answers every n-th record
starting at i, so n processes can share the work; concatenate their outputs in any order.
The output is written atomically (temp file, then rename).

`--regenerate-endpoint URL[,URL...]` (with `--regenerate-model`, `--regenerate-concurrency`) asks OpenAI-compatible
servers of the target instead, as `convert --regenerate-endpoint` does (docs/regeneration.md: greedy token-id
prompts, the servers checked against the target, answers kept in `.OUTPUT.progress.jsonl` as they arrive so that a
killed run continues; removed once the output is written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from eagle_trt.errors import EagleError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="HF model dir or .gguf")
    ap.add_argument("data", nargs="+", help=".jsonl prompt files (or 'humaneval')")
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-prompt-tokens", type=int, default=384)
    ap.add_argument("--shard", default="0/1", help="i/n: answer records i, i+n, i+2n, ...")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="auto", help="auto (a CUDA GPU if torch sees one), cpu, cuda or cuda:N; "
                    "greedy with full fp32 matrix products on each")
    ap.add_argument("--regenerate-endpoint", help="URL[,URL...] of OpenAI-compatible servers of TARGET: ask them")
    ap.add_argument("--regenerate-model", help="the model id to ask for (default: the one that names TARGET)")
    ap.add_argument("--regenerate-concurrency", type=int, default=8, help="requests in flight per URL")
    args = ap.parse_args()
    try:
        run(args)
    except EagleError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


def write_answers(out: Path, records, answers: list[list[int]], tokenizer, eos: set[int]) -> None:
    """One row per answered record (the input row plus "response" and "eos": whether the answer ended on an end
    token, which is cut off), written atomically: a temp file beside `out`, then renamed."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for rec, ans in zip(records, answers):
            ended = bool(ans) and ans[-1] in eos
            text = tokenizer.decode(ans[:-1] if ended else ans, skip_special_tokens=False)
            row = ({"messages": rec.messages} if rec.kind == "chat"
                   else {"prompt": rec.text, **({} if rec.chat else {"chat": False})})
            f.write(json.dumps({**row, "response": text, "eos": ended}, ensure_ascii=False) + "\n")
    tmp.replace(out)


def run(args) -> None:
    import torch

    from eagle_trt.convert.data import has_prompt, prompt_ids, read_records, regenerate
    from eagle_trt.convert.regen_endpoint import EndpointOptions, EndpointRegenerator, connect
    from eagle_trt.eos import eos_token_ids
    from eagle_trt.convert.device import resolve_device
    from eagle_trt.convert.load_target import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    i, n = (int(x) for x in args.shard.split("/"))
    device = resolve_device(args.device)
    out = Path(args.output)
    served = None
    if args.regenerate_endpoint:  # reached and checked before the model loads
        served = connect(EndpointOptions.parse(args.regenerate_endpoint, model=args.regenerate_model,
                                               concurrency=args.regenerate_concurrency), args.target)
    model, tokenizer, _ = load_target(args.target)
    model.to(device).eval()
    records = [r for r in read_records(args.data) if has_prompt(r) and r.response is None][i::n]
    prompts = [prompt_ids(r, tokenizer, max_tokens=args.max_prompt_tokens) for r in records]
    eos = {tokenizer.eos_token_id}  # where local generation stops; a server stops at any of the model's end tokens
    t0 = time.perf_counter()
    progress = out.with_name(f".{out.name}.progress.jsonl")
    if served is not None:
        eos |= set(eos_token_ids(getattr(model.config, "eos_token_id", None)))
        ends = [tokenizer.eos_token_id, *sorted(eos - {tokenizer.eos_token_id})]
        answers = EndpointRegenerator(served, model, tokenizer, ends, progress,
                                      {"target": str(Path(args.target).expanduser().resolve())})(
            prompts, args.max_new_tokens)
    else:
        answers = regenerate(model, tokenizer, prompts, args.max_new_tokens, args.batch_size)
    write_answers(out, records, answers, tokenizer, eos)
    progress.unlink(missing_ok=True)
    n_tok = sum(len(a) for a in answers)
    print(f"{len(records)} answers, {n_tok} tokens in {time.perf_counter() - t0:.0f} s -> {out}")


if __name__ == "__main__":
    main()
