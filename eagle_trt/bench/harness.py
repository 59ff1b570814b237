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
from eagle_trt.bench.methods import BASELINES, LLAMA_CPP_METHODS, REFERENCE, Method, build_methods, default_methods
from eagle_trt.bench.prompts import Prompt, load_prompts
from eagle_trt.errors import InputError
from eagle_trt.runtime.session import Session



def run_bench(methods: list[Method], prompts: list[tuple[Prompt, list[int]]], max_new_tokens: int,
              repeats: int = 3, warmup: bool = True,
              progress: Callable[[str], None] | None = None, references: dict | None = None,
              compare: list[tuple[str, str]] = ()) -> dict:
    """Returns {"runs", "checks", "failures", "warnings", "summary", "speedups", "per_prompt", "comparisons"}.

    references: method name -> (reference method name, fatal) for the output checks; default REFERENCE.
    compare: further (method, other method) pairs whose outputs are compared, for information only."""
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
    comparisons = [c for m, other in compare for c in check_outputs(runs, {m: (other, False)})]
    names = [m.name for m in methods]
    result = aggregate(runs, names, repeats)
    result["checks"] = checks
    result["comparisons"] = comparisons
    result["failures"] = [c for c in checks if not c["match"] and c["fatal"]]
    result["warnings"] = [_differs(c) for c in checks if not c["match"] and not c["fatal"]]
    result["methods"] = {m.name: {"speculative": m.speculative, **m.settings} for m in methods}
    for run in runs:
        run.pop("token_ids")
        run.pop("steps")
    result["runs"] = runs
    return result


def _differs(check: dict) -> dict:
    """The note for another implementation's output that parts from its reference (never a failure)."""
    llama = check["method"] in LLAMA_CPP_METHODS
    return {**check, "kind": "llama_cpp_differs" if llama else "hf_differs",
            "message": f"{check['method']} differs from {check['reference']} on {check['prompt']} at token "
                       f"{check['first_difference']} ({'llama.cpp' if llama else 'HF'} numerics, not a failure)"}


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
    for m, r in stats.plain_step_ratios(summary).items():
        summary[m]["verify_over_plain_step"], summary[m]["draft_over_plain_step"] = r["verify"], r["draft"]
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
                 progress: Callable[[str], None] | None = None, force: bool = False, gguf=None,
                 draft_gguf=None) -> dict:
    """The whole `eagle-trt bench`: open the engine, run, measure the machine, write the report files.

    Returns the results dict (also written to out/results.json); results["failures"] lists every
    speculative output that differs from plain AR decoding. gguf: the file the llama.cpp methods decode;
    draft_gguf: the one llama.cpp-draft drafts with."""

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
    # A bad --methods fails before any prompt is read.
    method_objs = _methods(session, methods, (gguf, draft_gguf), max_new_tokens)
    encoded, cut, full = _encode(prompt_set, session, progress)
    truncated = len(cut)
    llama = _llama_cpp_info(method_objs, session.tokenizer, full, progress)
    # The copy bandwidth before the runs as well as after them: on a shared machine one moment can be a slow one.
    bandwidth_before = (roofline.copy_bandwidth(bandwidth_mb),) if machine else ()
    results = run_bench(method_objs, encoded, max_new_tokens, repeats, progress=progress,
                        compare=_llama_cpp_pairs(methods))
    for m in method_objs:  # llama.cpp loaded in this process slows the forwards the curve times next
        if m.name in LLAMA_CPP_METHODS:
            m.close()
    results["warnings"] = cut + (llama["tokenizer"]["mismatches"] if llama else []) + results["warnings"]
    if llama:
        _add_llama_cpp(results, llama)
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
                                                      aux_layers=session.runner.aux_layers,
                                                      earlier_bandwidth=bandwidth_before)
        results["roofline"] = roofline.derive(results["machine"], results["summary"])
    if out is not None:
        results["plots"] = [str(p) for p in (_plots(results, out) if plots else [])]
        report.write_json(results, out)
        report.write_markdown(results, out)
    return results


def _encode(prompt_set, session, progress):
    """Each prompt's ids as benchmarked (cut to the engine's max_input_len), the cuts, and the ids before any cut."""
    max_in = session.runner.max_input_len
    encoded, cut, full = [], [], []
    for p in prompt_set:
        ids = p.encode(session.tokenizer)
        full.append((p, ids))
        if len(ids) > max_in:  # keep the end: that is where the model continues
            cut.append({"kind": "truncated_prompt", "prompt": p.id, "tokens": len(ids), "kept": max_in,
                        "message": f"prompt {p.id} has {len(ids):,} tokens, more than the engine's max_input_len "
                                   f"{max_in:,}: only its last {max_in:,} are benchmarked"})
            ids = ids[-max_in:]
        encoded.append((p, ids))
    for w in cut:
        if progress:
            progress(f"warning: {w['message']}")
    return encoded, cut, full


def _methods(session, names: list[str], ggufs: tuple, max_new_tokens: int) -> list[Method]:
    """Our methods and HF's on the open session, llama.cpp's on the GGUF, in the order named."""
    ours = build_methods(session, [n for n in names if n not in LLAMA_CPP_METHODS])
    wanted = [n for n in names if n in LLAMA_CPP_METHODS]
    if not wanted:
        return ours
    from eagle_trt.bench.llamacpp import build_llama_methods

    # The context holds the longest prompt the engine takes plus this run's output (and the drafter's slack,
    # which llama-cpp-python cuts to the context itself).
    n_ctx = session.runner.max_input_len + max_new_tokens
    theirs = build_llama_methods(wanted, ggufs[0], torch.get_num_threads(), n_ctx, session.runner.eos_token_ids,
                                 draft_gguf=ggufs[1])
    by_name = {m.name: m for m in ours + theirs}
    return [by_name[n] for n in names]


def _llama_cpp_info(method_objs, tokenizer, prompts, progress) -> dict | None:
    """llama.cpp's version and its tokenizer checked against ours on every prompt (None without llama.cpp)."""
    llama = [m for m in method_objs if m.name in LLAMA_CPP_METHODS]
    if not llama:
        return None
    from eagle_trt.bench.llamacpp import import_llama_cpp, tokenizer_agreement, versions

    agreement = tokenizer_agreement(llama[0].llama, tokenizer, prompts)
    for w in agreement["mismatches"]:
        w["kind"] = "llama_cpp_tokenizer"
        if progress:
            progress(f"warning: {w['message']}")
    return {**versions(import_llama_cpp()), "gguf": llama[0].settings["gguf"], "methods": [m.name for m in llama],
            "threads": llama[0].settings["threads"], "tokenizer": agreement}


def _llama_cpp_pairs(names: list[str]) -> list[tuple[str, str]]:
    """llama.cpp's speculation against its own plain decoding (whether its batched verify keeps its greedy output),
    where both run."""
    return [(m, "llama.cpp") for m in LLAMA_CPP_METHODS[1:] if m in names and "llama.cpp" in names]


def _add_llama_cpp(results: dict, info: dict) -> None:
    """results["llama_cpp"]: what llama.cpp ran, and where its greedy tokens equal ours and its own plain ones."""
    from eagle_trt.bench.llamacpp import greedy_agreement

    pairs = _llama_cpp_pairs(info["methods"])
    results["llama_cpp"] = {**info, "greedy_vs_ar": greedy_agreement(results["checks"], info["methods"]),
                            "speculative_vs_plain": greedy_agreement(results["comparisons"], [m for m, _ in pairs])}


def _plots(results: dict, out) -> list:
    from eagle_trt.bench.plots import write_plots

    try:
        return write_plots(results, out)
    except ImportError:  # pragma: no cover - matplotlib is a dependency; keep the numbers if it is gone
        return []
