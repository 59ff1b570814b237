"""Let a built engine answer a prompt file (greedy, batched plain decoding) and save the answers for head training.

    python scripts/regenerate_engine.py engines/gemma3-270m data/gemma3_chat_prompts.jsonl \\
        --output data/gemma3_chat_answers.jsonl --max-new-tokens 160 --batch 16 --threads 2

The same rows as scripts/regenerate_answers.py writes (the input row plus `"response"` and `"eos"`), but the
answers come from the engine's compiled kernels through its continuous batcher (`runtime/loop.py`) in `ar`
mode: every answer is `eagle-trt run --mode ar`'s tokens for that prompt alone, i.e. what the bench's target
decodes (bf16 engine: its rounding, not transformers' fp32). On a small CPU this is the fast path: the batch
shares each forward's weight reads, and no draft head runs. `--offset K --limit N` answers prompts K to K+N-1
only (a slice, or a few to measure the rate). The output is written atomically (temp file, then rename).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from eagle_trt.errors import EagleError, InputError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from regenerate_answers import write_answers  # noqa: E402  (one row format for both scripts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", help="an engine dir (eagle-trt build)")
    ap.add_argument("data", nargs="+", help=".jsonl prompt files")
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--max-prompt-tokens", type=int, default=384)
    ap.add_argument("--batch", type=int, default=16, help="requests decoded together")
    ap.add_argument("--offset", type=int, default=0, help="skip the first N prompts")
    ap.add_argument("--limit", type=int, default=0, help="answer N prompts only (0: all)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    try:
        run(args)
    except EagleError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


def answer_all(session, prompts: list[list[int]], max_new_tokens: int, batch: int) -> tuple[list[list[int]], int]:
    """Greedy `ar` answers for every prompt, `batch` at a time sharing each forward; returns (answers, steps)."""
    from eagle_trt.runtime.loop import DecodeLoop

    runner = DecodeLoop(session.runner, max_batch=batch)
    config = session.decode_config(tuned=False, max_new_tokens=max_new_tokens, mode="ar")
    for ids in prompts:
        runner.check(ids, config)  # a prompt the engine cannot hold fails before any work
    answers: list[list[int] | None] = [None] * len(prompts)
    waiting = list(range(len(prompts)))[::-1]
    owner: dict[int, int] = {}
    reported = 0
    while waiting or runner.active:
        while waiting and len(runner.active) < batch:
            slot = runner.admit(prompts[waiting[-1]], config)
            if slot is None:
                break
            owner[id(slot)] = waiting.pop()
        for slot in runner.step():
            answers[owner.pop(id(slot))] = list(slot.request.output)
        done = len(prompts) - len(waiting) - len(runner.active)
        if done >= reported + 50:
            reported = done
            print(f"  {done}/{len(prompts)} answered", file=sys.stderr, flush=True)
    return answers, runner.steps


def run(args) -> None:
    from eagle_trt.cli.common import apply_threads
    from eagle_trt.convert.data import has_prompt, prompt_ids, read_records
    from eagle_trt.runtime.session import Session

    if args.batch < 1 or args.max_new_tokens < 1:
        raise InputError("--batch and --max-new-tokens must be at least 1")
    apply_threads(args.threads)
    session = Session.open(args.engine)
    records = [r for r in read_records(args.data) if has_prompt(r) and r.response is None]
    records = records[args.offset:args.offset + args.limit if args.limit else None]
    tok = session.tokenizer
    prompts = [prompt_ids(r, tok, max_tokens=args.max_prompt_tokens) for r in records]
    eos = set(session.runner.eos_token_ids)
    t0 = time.perf_counter()
    answers, steps = answer_all(session, prompts, args.max_new_tokens, args.batch)
    seconds = time.perf_counter() - t0
    out = Path(args.output)
    write_answers(out, records, answers, tok, eos)
    n_tok = sum(len(a) for a in answers)
    print(f"{len(records)} answers, {n_tok} tokens in {seconds:.0f} s ({n_tok / seconds:.1f} tokens/s, "
          f"{steps} steps, batch {args.batch}) -> {out}")


if __name__ == "__main__":
    main()
