#!/usr/bin/env python3
"""Check a TensorRT-LLM bundle where it will be served: `python validate.py` inside the bundle dir.

Needs TensorRT-LLM (and the PyYAML it installs) and an NVIDIA GPU, nothing from eagle-trt or modelopt:
the build copies this file into every LLM-API trtllm bundle as validate.py. It builds LLM(...) from
the bundle's own extra_llm_api_options.yaml, generates greedily with and without the draft (an EAGLE-3 head
or a draft model),
checks that both outputs are the same tokens, and prints the acceptance per decoding iteration.

    python validate.py                       # 3 prompts, 32 tokens each
    python validate.py --max-tokens 64 --prompt "Hello" --json validate.json

Exit code: 0 outputs equal, 1 outputs differ or a generation failed, 2 the bundle is for another
TensorRT-LLM line than the installed one, 3 no TensorRT-LLM or no GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPTIONS = "extra_llm_api_options.yaml"
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.")


class Exit(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def require_tensorrt_llm():
    """Import tensorrt_llm and check for a CUDA GPU; Exit(3) with the reason where either is missing."""
    try:
        import tensorrt_llm
    except ModuleNotFoundError as exc:
        raise Exit(3, f"TensorRT-LLM is not installed ({exc}); run this in TensorRT-LLM's container "
                      "or an environment with `pip install tensorrt-llm`") from None
    except Exception as exc:  # noqa: BLE001 - a broken install fails in many ways (CUDA libs, MPI)
        raise Exit(3, f"`import tensorrt_llm` failed: {type(exc).__name__}: {exc}") from None
    if not hasattr(tensorrt_llm, "LLM"):
        raise Exit(3, "the installed tensorrt_llm has no LLM API (a placeholder package, not TensorRT-LLM)")
    try:
        import torch

        gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        gpu = False
    if not gpu:
        raise Exit(3, "no CUDA GPU is visible (torch.cuda.is_available() is False); TensorRT-LLM needs one")
    return tensorrt_llm


_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:rc(\d+))?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[\w.]+)?$")


def release_key(version: str | None):
    """(major, minor, patch, (0, rc) or (1, 0) for a final release), or None; .postN / .devN read as their release
    (eagle_trt.engine.trtllm_lines.parse_release, which a test keeps this equal to)."""
    match = _RELEASE.match((version or "").strip())
    if not match:
        return None
    major, minor, patch, rc = match.groups()
    return int(major), int(minor), int(patch or 0), (0, int(rc)) if rc is not None else (1, 0)


def installed_line(version: str, lines: dict) -> str | None:
    """The line whose range (trtllm.json "lines": from inclusive, before exclusive) holds this release."""
    have = release_key(version)
    if have is None:
        return None
    for name, span in lines.items():
        before = release_key(span["before"]) if span.get("before") else None
        if release_key(span["from"]) <= have and (before is None or have < before):
            return name
    return None


def check_line(meta: dict, version: str) -> None:
    bundle_line, lines = meta["trtllm_version"], meta.get("lines") or {}
    have = installed_line(version, lines)
    if have == bundle_line:
        return
    if have:
        fix = f"rebuild it with `eagle-trt build --trtllm-version {have}`"
    else:
        oldest = min((span["from"] for span in lines.values()), key=release_key, default="1.2.0rc7")
        fix = (f"it reads decoding_type Eagle3 / Draft_Target, which TensorRT-LLM has from {oldest}: install that "
               "or newer")  # fmt: skip
    raise Exit(2, f"this bundle is for TensorRT-LLM {bundle_line} but {version} is installed: {fix}")


def llm_kwargs(options: dict, speculative: bool) -> dict:
    """LLM(...) keyword arguments from the YAML: config objects built, the draft path made absolute."""
    from tensorrt_llm import llmapi

    kwargs = {k: v for k, v in options.items() if k not in ("speculative_config", "kv_cache_config")}
    kwargs["kv_cache_config"] = llmapi.KvCacheConfig(**options.get("kv_cache_config", {}))
    if speculative:
        spec = dict(options["speculative_config"])
        spec["speculative_model"] = str((HERE / spec["speculative_model"]).resolve())
        # An EAGLE-3 head, or a draft model (decoding_type Draft_Target: DraftTargetDecodingConfig in both lines).
        draft_model = spec["decoding_type"] == "Draft_Target"
        config = llmapi.DraftTargetDecodingConfig if draft_model else llmapi.Eagle3DecodingConfig
        kwargs["speculative_config"] = config(**spec)
    return kwargs


def generate(trt, options: dict, speculative: bool, prompts: list[str], max_tokens: int) -> list[dict]:
    llm = trt.LLM(model=str(HERE / "target"), tokenizer=str(HERE / "tokenizer"), **llm_kwargs(options, speculative))
    try:
        params = trt.SamplingParams(max_tokens=max_tokens, top_k=1)  # greedy
        outputs = llm.generate(list(prompts), params)
    finally:
        llm.shutdown()
    results = []
    for out in outputs:
        done = out.outputs[0]
        spec = getattr(getattr(done, "request_perf_metrics", None), "speculative_decoding", None)
        results.append({
            "token_ids": list(done.token_ids),
            # The request's output carries the iterations (its CompletionOutput has none); 0 means not reported.
            "iterations": int(getattr(out, "decoding_iter", 0) or 0),
            "draft_tokens": int(getattr(spec, "total_draft_tokens", 0) or 0),
            "accepted_draft_tokens": int(getattr(spec, "total_accepted_draft_tokens", 0) or 0),
        })  # fmt: skip
    return results


def run(args) -> dict:
    trt = require_tensorrt_llm()
    import yaml  # installed with TensorRT-LLM

    meta = json.loads((HERE / "trtllm.json").read_text(encoding="utf-8"))
    options = yaml.safe_load((HERE / OPTIONS).read_text(encoding="utf-8"))
    version = str(getattr(trt, "__version__", "?"))
    check_line(meta, version)
    import torch

    print(f"TensorRT-LLM {version}, bundle for line {meta['trtllm_version']} ({meta['tree']}), "
          f"GPU {torch.cuda.get_device_name(0)}", flush=True)  # fmt: skip
    prompts = args.prompt or list(PROMPTS)
    start = time.monotonic()
    plain = generate(trt, options, False, prompts, args.max_tokens)
    spec = generate(trt, options, True, prompts, args.max_tokens)
    report = {"tensorrt_llm": version, "trtllm_version": meta["trtllm_version"], "prompts": [], "equal": True}
    for i, (p, s) in enumerate(zip(plain, spec)):
        same = p["token_ids"] == s["token_ids"]
        report["equal"] &= same
        per_iter = len(s["token_ids"]) / s["iterations"] if s["iterations"] else 0.0
        report["prompts"].append({"prompt": prompts[i], "equal": same, "tokens": len(s["token_ids"]),
                                  "iterations": s["iterations"], "tokens_per_iteration": round(per_iter, 3),
                                  "accepted_draft_tokens": s["accepted_draft_tokens"],
                                  "draft_tokens": s["draft_tokens"]})  # fmt: skip
        its = (f"{s['iterations']} iterations ({per_iter:.2f} tokens/iteration" if s["iterations"]
               else "iterations not reported (")
        drafts = (f"{s['accepted_draft_tokens']}/{s['draft_tokens']} draft tokens accepted" if s["draft_tokens"]
                  else "draft tokens not reported")
        print(f"prompt {i + 1}: {len(s['token_ids'])} tokens in {its}, {drafts}); speculative == plain: "
              f"{'yes' if same else 'NO'}", flush=True)  # fmt: skip
        if not same:
            print(f"  plain: {p['token_ids'][:16]}\n  spec:  {s['token_ids'][:16]}", flush=True)
    report["seconds"] = round(time.monotonic() - start, 1)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    ap.add_argument("--prompt", action="append", help="a prompt (repeatable; default: three built-in prompts)")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    try:
        report = run(args)
    except Exit as exc:
        print(f"validate: {exc}", file=sys.stderr)
        return exc.code
    except Exception as exc:  # noqa: BLE001 - TensorRT-LLM's own reason, in one line
        print(f"validate: FAIL: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:  # written whole or not at all
        tmp = args.json.with_name(f".{args.json.name}.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        tmp.replace(args.json)
    verdict = "PASS: speculative output equals plain greedy output" if report["equal"] else "FAIL: outputs differ"
    print(f"{verdict} on {len(report['prompts'])} prompts ({report['seconds']} s)")
    return 0 if report["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
