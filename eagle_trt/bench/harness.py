"""Run every method on every prompt, repeat, check losslessness, and aggregate.

    results = run_bench(methods, encoded_prompts, max_new_tokens=64, repeats=3)
    results["summary"]["tree"]["tokens_per_second"]["median"], results["failures"]

Repeats are the outer loop and methods the inner one, so all methods of one repeat see the same
machine conditions; speedups are ratios taken within a repeat (see stats.speedups).
"""

from __future__ import annotations

from typing import Callable

import torch

from eagle_trt.bench import report, roofline, stats
from eagle_trt.bench.methods import BASELINES, REFERENCE, Method, build_methods, default_methods
from eagle_trt.bench.prompts import Prompt, load_prompts
from eagle_trt.errors import InputError
from eagle_trt.runtime.session import Session



def run_bench(methods: list[Method], prompts: list[tuple[Prompt, list[int]]], max_new_tokens: int,
              repeats: int = 3, warmup: bool = True,
              progress: Callable[[str], None] | None = None, references: dict | None = None) -> dict:
    """Returns {"runs", "checks", "failures", "warnings", "summary", "speedups", "per_prompt"}.

    references: method name -> (reference method name, fatal) for the output checks; default REFERENCE."""
    if warmup and prompts:
        for m in methods:  # first-call costs (allocator, lazy init) stay out of the numbers
            m.run(prompts[0][1], min(max_new_tokens, 8))
    runs: list[dict] = []
    total = repeats * len(prompts) * len(methods)
    done = 0
    for r in range(repeats):
        for p, ids in prompts:
            for m in methods:
                out = m.run(ids, max_new_tokens)
                runs.append({
                    "prompt": p.id, "category": p.category, "method": m.name, "repeat": r,
                    "prompt_tokens": len(ids), "tokens": len(out.token_ids), "seconds": out.seconds,
                    "tokens_per_second": len(out.token_ids) / out.seconds if out.seconds > 0 else 0.0,
                    "draft_ms": out.draft_s * 1e3, "verify_ms": out.verify_s * 1e3,
                    "steps": out.steps, "token_ids": out.token_ids, "metrics": out.metrics,
                })
                done += 1
                if progress:
                    progress(f"[{done}/{total}] repeat {r + 1} {p.id} {m.name}: "
                             f"{runs[-1]['tokens_per_second']:.1f} tok/s")
    checks = check_outputs(runs, references)
    names = [m.name for m in methods]
    result = aggregate(runs, names, repeats)
    result["checks"] = checks
    result["failures"] = [c for c in checks if not c["match"] and c["fatal"]]
    result["warnings"] = [{**c, "kind": "hf_differs", "message": f"{c['method']} differs from {c['reference']} on "
                           f"{c['prompt']} at token {c['first_difference']} (HF numerics, not a failure)"}
                          for c in checks if not c["match"] and not c["fatal"]]
    result["methods"] = {m.name: {"speculative": m.speculative, **m.settings} for m in methods}
    for run in runs:
        run.pop("token_ids")
        run.pop("steps")
    result["runs"] = runs
    return result


def check_outputs(runs: list[dict], references: dict | None = None) -> list[dict]:
    """Compare each run with its reference method's run on the same prompt and repeat (T=0)."""
    references = REFERENCE if references is None else references
    index = {(x["repeat"], x["prompt"], x["method"]): x for x in runs}
    checks = []
    for x in runs:
        ref_name, fatal = references.get(x["method"], (None, False))
        ref = index.get((x["repeat"], x["prompt"], ref_name))
        if ref is None:
            continue
        diff = stats.first_difference(x["token_ids"], ref["token_ids"])
        checks.append({"prompt": x["prompt"], "repeat": x["repeat"], "method": x["method"], "reference": ref_name,
                       "match": diff is None, "fatal": fatal, "first_difference": diff,
                       "tokens": x["tokens"], "reference_tokens": ref["tokens"]})
    return checks


def aggregate(runs: list[dict], names: list[str], repeats: int) -> dict:
    tps = {m: stats.throughput_per_repeat(runs, m, repeats) for m in names}
    baselines = [b for b in (*BASELINES, "tree-untuned", "draft-model-untuned") if b in names]
    summary = {}
    for m in names:
        rows = [x for x in runs if x["method"] == m]
        first = [x for x in rows if x["repeat"] == 0]  # acceptance is deterministic at T=0: one repeat
        acc = stats.acceptance([tuple(s) for x in first for s in x["steps"]])
        draft = sum(x["draft_ms"] for x in first)
        verify = sum(x["verify_ms"] for x in first)
        # tau and the draft/verify split exist for our EAGLE methods (HF does not expose them).
        speculative = bool(rows) and rows[0]["metrics"] is not None and rows[0]["metrics"]["mode"] == "eagle"
        summary[m] = {
            "tokens_per_second": stats.summarize(tps[m]),
            "tokens_per_second_per_repeat": tps[m],
            "generated_tokens": sum(x["tokens"] for x in first),
            "acceptance_length": acc.tau if speculative else None,
            "acceptance_per_depth": acc.per_depth if speculative else None,
            "verify_steps": acc.steps if speculative else None,
            "draft_ms": draft if speculative else None,
            "verify_ms": verify if speculative else None,
            "draft_ms_per_step": draft / acc.steps if speculative and acc.steps else None,
            "verify_ms_per_step": verify / acc.steps if speculative and acc.steps else None,
            "draft_share": draft / (draft + verify) if speculative and draft + verify > 0 else None,
            "tau_per_prompt": [stats.acceptance([tuple(s) for s in x["steps"]]).tau for x in first]
            if speculative else [],
            # Accepted draft tokens that the prompt-lookup branch supplied (tree-lookup), out of all accepted.
            "lookup_accepted": sum(x["metrics"].get("lookup_tokens_accepted", 0) for x in first)
            if speculative else None,
            "datastore_accepted": sum(x["metrics"].get("datastore_tokens_accepted", 0) for x in first)
            if speculative else None,
            "draft_accepted": sum(s[0] for x in first for s in x["steps"]) if speculative else None,
        }
    per_prompt = {}
    for x in runs:
        d = per_prompt.setdefault(x["prompt"], {}).setdefault(x["method"], {"tps": []})
        d["tps"].append(x["tokens_per_second"])
        if x["repeat"] == 0 and x["metrics"] is not None:
            mt = x["metrics"]
            d.update(tokens=x["tokens"], acceptance_length=mt["acceptance_length"],
                     acceptance_per_depth=mt["acceptance_per_depth"], draft_ms=mt["draft_ms"],
                     verify_ms=mt["verify_ms"])
    for methods in per_prompt.values():
        for d in methods.values():
            s = stats.summarize(d.pop("tps"))
            d["tokens_per_second"] = {"min": s["min"], "median": s["median"]}
    return {"summary": summary, "baselines": baselines, "speedups": stats.speedups(tps, baselines),
            "per_prompt": per_prompt}


def bench_engine(engine, prompts: str = "chat", limit: int | None = None, max_new_tokens: int = 64,
                 repeats: int = 3, methods: list[str] | None = None, out=None, verify: bool = True,
                 machine: bool = True, bandwidth_mb: int = 256, plots: bool = True, command: str = "",
                 progress: Callable[[str], None] | None = None, force: bool = False) -> dict:
    """The whole `eagle-trt bench`: open the engine, run, measure the machine, write the report files.

    Returns the results dict (also written to out/results.json); results["failures"] lists every
    speculative output that differs from plain AR decoding."""

    if repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    prompt_set = load_prompts(prompts, limit)
    if out is not None:
        out = report.prepare_out(out, force)  # before anything is measured
    session = Session.open(engine, verify=verify)
    if session.config.backend != "torch":
        raise InputError("eagle-trt bench runs torch engines; this one is built for TensorRT-LLM")
    if max_new_tokens > session.config.max_output_len:
        raise InputError(f"--max-new-tokens {max_new_tokens} exceeds the engine's max_output_len "
                         f"{session.config.max_output_len}")
    if methods is None:
        methods = default_methods(session)
    method_objs = build_methods(session, methods)  # a bad --methods fails before any prompt is looked at
    max_in = session.runner.max_input_len
    encoded, cut = [], []
    for p in prompt_set:
        ids = p.encode(session.tokenizer)
        if len(ids) > max_in:  # keep the end: that is where the model continues
            cut.append({"kind": "truncated_prompt", "prompt": p.id, "tokens": len(ids), "kept": max_in,
                        "message": f"prompt {p.id} has {len(ids):,} tokens, more than the engine's max_input_len "
                                   f"{max_in:,}: only its last {max_in:,} are benchmarked"})
            ids = ids[-max_in:]
        encoded.append((p, ids))
    for w in cut:
        if progress:
            progress(f"warning: {w['message']}")
    truncated = len(cut)
    results = run_bench(method_objs, encoded, max_new_tokens, repeats, progress=progress)
    results["warnings"] = cut + results["warnings"]
    results["config"] = {
        "engine": str(engine), "prompts": prompts, "num_prompts": len(encoded), "limit": limit,
        "max_new_tokens": max_new_tokens, "repeats": repeats, "methods": methods,
        "threads": torch.get_num_threads(), "truncated_prompts": truncated, "command": command,
        "torch": torch.__version__, "kernels": session.kernels, "weights": session.weights,
    }
    results["tuned"] = session.tuned or None
    if machine:
        if progress:
            progress("measuring memory bandwidth and the verify-cost curve")
        context = int(sum(len(i) for _, i in encoded) / len(encoded)) + max_new_tokens // 2
        max_tree = max(65, session.decode_config().tree_capacity())
        results["machine"] = roofline.measure_machine(session.runner.target, context, max_tree, bandwidth_mb,
                                                      aux_layers=session.runner.aux_layers)
        results["roofline"] = roofline.derive(results["machine"], results["summary"])
    if out is not None:
        results["plots"] = [str(p) for p in (_plots(results, out) if plots else [])]
        report.write_json(results, out)
        report.write_markdown(results, out)
    return results


def _plots(results: dict, out) -> list:
    from eagle_trt.bench.plots import write_plots

    try:
        return write_plots(results, out)
    except ImportError:  # pragma: no cover - matplotlib is a dependency; keep the numbers if it is gone
        return []
