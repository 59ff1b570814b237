"""Acceptance length tau of a converted checkpoint, measured with eagle-trt's own runtime.

    from eagle_trt.convert.validate import measure_acceptance
    report = measure_acceptance("/tmp/ckpt/target", "/tmp/ckpt/draft", prompts)   # prompts: token id lists
    report["chain"]["acceptance_length"], report["dynamic"]["acceptance_length"]
    checkpoint_report("/tmp/ckpt", tokenizer, prompts, training)   # report.json's content, as convert writes it

Greedy (T=0) speculative decoding of each held-out prompt with a chain (draft_length 6) and with the
EAGLE-2 dynamic tree (the runtime defaults); tau = tokens committed per target forward, so 1.0 means
the head never helps. The output is token-identical to plain greedy decoding either way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.eos import eos_from_files
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.prompt_sources import chat_ids
from eagle_trt.runtime.runner import Runner

# Used when the training data left nothing to hold out (e.g. a single text file).
FALLBACK_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three tips for writing clear documentation.",
)


def fallback_prompt_ids(tokenizer) -> list[list[int]]:
    return [chat_ids(tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True)
            for p in FALLBACK_PROMPTS]


def measure_acceptance(target_dir: str | Path, draft_dir: str | Path, prompts: list[list[int]],
                       max_new_tokens: int = 64, trees: tuple[str, ...] = ("chain", "dynamic"),
                       max_prompt_tokens: int = 512) -> dict:
    """Mean tau (weighted by verify steps) per tree mode, plus per-prompt values."""
    target = LlamaTarget.load(Path(target_dir))
    head = Eagle3DraftHead.load(Path(draft_dir), target)
    prompts = [list(p)[-max_prompt_tokens:] for p in prompts if p]
    report: dict = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "temperature": 0.0}
    for tree in trees:
        taus, tokens, steps, committed = [], 0, 0, 0.0
        t0 = time.perf_counter()
        # The configured tree (no step budget): tau is the head's, not what this machine's costs let it draft.
        runner = Runner(target, head, capacity=2048, eos_token_ids=eos_from_files(target_dir), budget=False)
        for ids in prompts:
            result = runner.generate(ids, DecodeConfig(max_new_tokens=max_new_tokens, tree=tree, eos_token_ids=None))
            m = result.metrics
            taus.append(round(m.acceptance_length, 4))
            tokens += m.generated_tokens
            steps += m.verify_steps
            committed += m.acceptance_length * m.verify_steps
        report[tree] = {
            # the runtime's tau over all verify steps of all prompts (not a mean of per-prompt taus)
            "acceptance_length": round(committed / steps, 4) if steps else 1.0,
            "per_prompt": taus,
            "generated_tokens": tokens,
            "seconds": round(time.perf_counter() - t0, 2),
        }
    return report


def checkpoint_report(checkpoint: str | Path, tokenizer, prompts: list[list[int]], training: dict | None,
                      max_new_tokens: int = 64) -> dict:
    """What report.json holds for a converted checkpoint (target/ + draft/): tau on `prompts` (convert's held-out
    prompts; the built-in ones when there are none) beside the training summary."""
    source = "held-out"
    if not prompts:
        prompts, source = fallback_prompt_ids(tokenizer), "built-in"
    checkpoint = Path(checkpoint)
    validation = measure_acceptance(checkpoint / "target", checkpoint / "draft", prompts, max_new_tokens=max_new_tokens)
    validation["prompt_source"] = source
    return {"validation": validation, "training": training}


def write_report(out_dir: str | Path, report: dict) -> Path:
    path = Path(out_dir) / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return path
