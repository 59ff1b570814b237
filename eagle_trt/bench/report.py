"""Bench outputs: results.json, report.md and the rich summary table."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.table import Table

from eagle_trt.bench.methods import DRAFT_SHARE_METHODS
from eagle_trt.errors import InputError


def _f(x, fmt=".2f", none="–") -> str:
    return none if x is None else format(x, fmt)


def _times(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def curve_line(machine: dict | None) -> str | None:
    """The measured forward-cost curve in one line (rows -> ms, and each over the 1-row forward), None without."""
    curve = sorted((int(k), v) for k, v in ((machine or {}).get("forward_ms") or {}).items())
    if not curve:
        return None
    one = dict(curve).get(1)
    parts = [f"{t}: {ms:.1f} ms" + (f" ({ms / one:.2f}×)" if one and t > 1 else "") for t, ms in curve]
    return f"target forward by rows ({machine['context_tokens']} cached tokens): " + ", ".join(parts)


def _speedup(s: dict | None) -> str:
    return "–" if not s else f"{s['median']:.2f}× ({s['min']:.2f}×)"


def summary_table(results: dict) -> Table:
    baselines = results["baselines"]
    table = Table(title="eagle-trt bench: median (min) over repeats", title_justify="left")
    table.add_column("method", style="bold", no_wrap=True)
    table.add_column("tok/s", justify="right", no_wrap=True)
    table.add_column("τ", justify="right")
    table.add_column("accept/depth")
    table.add_column("draft/verify ms", justify="right")
    table.add_column("verify/plain", justify="right")
    for b in baselines:
        table.add_column(f"vs {b}", justify="right")
    for m, s in results["summary"].items():
        tps = s["tokens_per_second"]
        depth = " ".join(f"{a:.2f}" for a in (s["acceptance_per_depth"] or [])[:4])
        split = ("–" if s["draft_ms_per_step"] is None
                 else f"{s['draft_ms_per_step']:.1f}/{s['verify_ms_per_step']:.1f}")
        row = [m, f"{tps['median']:.1f} ({tps['min']:.1f})", _f(s["acceptance_length"]), depth or "–", split,
               _times(s.get("verify_over_plain_step"))]
        for b in baselines:
            sp = results["speedups"][m].get(b)
            row.append("" if b == m or not sp else f"{sp['median']:.2f}× ({sp['min']:.2f})")
        table.add_row(*row)
    return table


RESULTS_NAME = "results.json"


def prepare_out(out: Path, force: bool = False) -> Path:
    """Make sure the results can be written before anything is measured: `out` is created (or is an empty dir, or
    --force lets its files be replaced) and writable. A bad --out is a one-line input error, never a lost run."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory; choose a new results dir")
    if out.is_dir() and any(out.iterdir()) and not force:
        held = "earlier results (results.json)" if (out / RESULTS_NAME).exists() else "other files"
        raise InputError(f"--out {out} already holds {held}; choose a new dir or pass --force to replace them")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise InputError(f"--out {out} is not writable ({e.strerror}); choose another results dir") from None
    return out


def write_json(results: dict, out: Path) -> Path:
    path = out / RESULTS_NAME
    path.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def markdown(results: dict) -> str:
    cfg = results.get("config", {})
    lines = ["# eagle-trt bench", ""]
    lines += [f"- engine: `{cfg.get('engine')}`",
              f"- prompts: {cfg.get('prompts')} ({cfg.get('num_prompts')} prompts), "
              f"max_new_tokens {cfg.get('max_new_tokens')}, repeats {cfg.get('repeats')}, "
              f"threads {cfg.get('threads')}, kernels {cfg.get('kernels', '?')}",
              f"- command: `{cfg.get('command', '')}`", ""]
    lines += _checks_md(results) + _summary_md(results) + _llama_cpp_md(results.get("llama_cpp"))
    lines += ["## Methods", ""]
    for m, settings in results["methods"].items():
        lines.append(f"- `{m}`: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    lines.append("")
    lines += _roofline_md(results)
    if results.get("tuned"):
        tree = "draft-model" if "draft-model" in results["summary"] else "tree"
        lines += ["## Tuned defaults", "", f"`{tree}` uses the settings stored by `eagle-trt tune`: "
                  + ", ".join(f"{k}={v}" for k, v in results["tuned"].items()) + "."]
        sp = results["speedups"].get(tree, {}).get(f"{tree}-untuned")
        if sp:
            lines.append(f"Against the build config's settings (`{tree}-untuned`): {_speedup(sp)}.")
        lines.append("")
    lines += _per_prompt_md(results)
    if results.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in results["plots"]]
    return "\n".join(lines) + "\n"


def _checks_md(results: dict) -> list[str]:
    """Whether every speculative output equalled AR (the failures if not), and HF's own differences."""
    failures, warnings = results["failures"], results["warnings"]
    n_checks = sum(1 for c in results["checks"] if c["fatal"])
    lines = []
    if failures:
        lines += [f"**FAILED: {len(failures)} of {n_checks} speculative outputs differ from plain AR decoding.**", ""]
        for c in failures[:20]:
            lines.append(f"- {c['method']} on {c['prompt']} (repeat {c['repeat'] + 1}): first difference at "
                         f"token {c['first_difference']}")
        lines.append("")
    else:
        lines += [f"Lossless: all {n_checks} speculative outputs equal plain AR decoding token for token (T=0).", ""]
    cut = [w for w in warnings if w.get("kind") == "truncated_prompt"]
    differ = [w for w in warnings if w.get("kind") == "hf_differs"]
    if cut:
        lines += [f"**Warning: {len(cut)} prompt(s) longer than the engine's max_input_len were cut to their last "
                  f"{cut[0]['kept']:,} tokens** (the numbers below are for the cut prompts):", ""]
        lines += [f"- {w['message']}" for w in cut[:20]]
        lines.append("")
    if differ:
        lines += [f"Note: {len(differ)} HF outputs differ from their reference (HF numerics; not a failure):", ""]
        for c in differ[:10]:
            lines.append(f"- {c['method']} vs {c['reference']} on {c['prompt']}: first difference at token "
                         f"{c['first_difference']}")
        lines.append("")
    return lines


def _summary_md(results: dict) -> list[str]:
    """The summary table (one row per method, speedups against each baseline) and what the copies brought."""
    baselines = results["baselines"]
    lines = ["## Summary", "", "Tokens/s over the whole prompt set per repeat: median (min). Speedups are "
             "ratios within each repeat: median (min). Verify and draft ÷ plain step: a speculative step's verify "
             "pass and its drafting in units of one `ar` token (a step pays when τ exceeds their sum).", ""]
    head = ["method", "tok/s", "τ", "accept by depth", "draft ms/step", "verify ms/step", "verify ÷ plain step",
            "draft ÷ plain step"]
    head += [f"vs {b}" for b in baselines]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, s in results["summary"].items():
        tps = s["tokens_per_second"]
        depth = " ".join(f"{a:.2f}" for a in (s["acceptance_per_depth"] or []))
        row = [f"`{m}`", f"{tps['median']:.2f} ({tps['min']:.2f})", _f(s["acceptance_length"]), depth or "–",
               _f(s["draft_ms_per_step"], ".1f"), _f(s["verify_ms_per_step"], ".1f"),
               _times(s.get("verify_over_plain_step")), _times(s.get("draft_over_plain_step"))]
        row += ["" if b == m else _speedup(results["speedups"][m].get(b)) for b in baselines]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    look = results["summary"].get("tree-lookup", {})
    if look.get("draft_accepted"):
        lines += [f"`tree-lookup`: {look['lookup_accepted']} of its {look['draft_accepted']} accepted draft tokens "
                  f"({look['lookup_accepted'] / look['draft_accepted']:.0%}) came from the prompt-lookup branches"
                  + (f", {look['datastore_accepted']} of them from the datastore." if look.get("datastore_accepted")
                     else "."), ""]
    return lines


def llama_cpp_line(info: dict) -> str:
    """One console line: llama.cpp's version, whether its tokenizer and greedy tokens agree with ours."""
    tok = info["tokenizer"]
    parts = [f"llama.cpp: llama-cpp-python {info['llama_cpp_python']}, llama.cpp {info.get('llama_cpp_commit') or '?'}",
             f"tokenizer agrees on {tok['agree']}/{tok['prompts']} prompts"]
    for name, g in [*info["greedy_vs_ar"].items(), *info.get("speculative_vs_plain", {}).items()]:
        parts.append(f"{name} = {g['reference']} on {g['equal']}/{g['prompts']}" + _parts(g))
    return "; ".join(parts)


def _parts(g: dict, most: int = 3) -> str:
    firsts = list(g["first_difference"].items())
    if not firsts:
        return ""
    shown = ", ".join(f"{p} at token {i}" for p, i in firsts[:most])
    return f" (parts on {shown}{', …' if len(firsts) > most else ''})"


def _llama_cpp_md(info: dict | None) -> list[str]:
    """What llama.cpp ran, whether its tokenizer agrees with ours, where its greedy tokens part from ours."""
    if not info:
        return []
    tok = info["tokenizer"]
    lines = ["## llama.cpp", "",
             f"- llama-cpp-python {info['llama_cpp_python']}, vendored llama.cpp commit "
             f"{info.get('llama_cpp_commit') or 'not exported'} (ggml {info.get('ggml_version') or '?'}), "
             f"{info['threads']} threads, on `{info['gguf']}`",
             f"- llama.cpp's CPU features: {info.get('system_info') or '?'}",
             f"- tokenizer: llama.cpp tokenizes {tok['agree']} of {tok['prompts']} prompts exactly as ours "
             "(it is fed our token ids either way)"]
    lines += [f"  - {m['message']}" for m in tok["mismatches"][:10]]
    for g_name, g in [*info["greedy_vs_ar"].items(), *info.get("speculative_vs_plain", {}).items()]:
        lines.append(f"- `{g_name}` greedy tokens equal `{g['reference']}`'s on {g['equal']} of {g['prompts']} "
                     "prompts" + _parts(g, most=10))
    return lines + [""]


def _bandwidth_samples(machine: dict) -> str:
    samples = machine.get("copy_bandwidth_samples_gb_s") or [machine["copy_bandwidth_gb_s"]]
    return ", ".join(f"{b:.2f}" for b in samples) + " GB/s"


def _roofline_md(results: dict) -> list[str]:
    """This run's bandwidth, the roofline and each method's share of it, and the verify-cost curve."""
    roof, machine = results.get("roofline"), results.get("machine")
    if not (roof and machine):
        return []
    lines = ["## Roofline", "",
             f"- memory copy bandwidth: {machine['copy_bandwidth_gb_s']:.2f} GB/s (the best of "
             f"{_bandwidth_samples(machine)} measured in this run, threads: {machine['threads']})",
             f"- target weights read per token: {roof['weight_mb_per_token']:.1f} MB",
             f"- roofline (bandwidth / weight bytes): {roof['roofline_tokens_per_second']:.1f} tokens/s"]
    for name in ("ar", "hf"):
        if f"{name}_fraction_of_roofline" in roof:
            lines.append(f"- `{name}` plain decoding reaches {roof[f'{name}_fraction_of_roofline']:.1%} "
                         "of the roofline")
    if "forward_16_over_1" in roof:
        lines.append(f"- a forward over 16 tree tokens costs {roof['forward_16_over_1']:.2f}× a 1-token forward")
    for name in DRAFT_SHARE_METHODS:
        if f"{name}_draft_share" in roof:
            lines.append(f"- drafting is {roof[f'{name}_draft_share']:.1%} of a `{name}` step (draft + verify)")
    lines += ["", f"Verify-cost curve (target forward after {machine['context_tokens']} cached tokens):", "",
              "| tokens | ms | ms / token |", "|---|---|---|"]
    for t, ms in sorted((int(k), v) for k, v in machine["forward_ms"].items()):
        lines.append(f"| {t} | {ms:.2f} | {ms / t:.2f} |")
    return lines + [""]


def _per_prompt_md(results: dict) -> list[str]:
    lines = ["## Per prompt", "",
             "| prompt | method | tok/s median (min) | τ | accept by depth | draft ms | verify ms |",
             "|---|---|---|---|---|---|---|"]
    for pid, methods in results["per_prompt"].items():
        for m, d in methods.items():
            tps = d["tokens_per_second"]
            depth = d.get("acceptance_per_depth") or []
            tau = _f(d.get("acceptance_length")) if depth else "–"
            lines.append(f"| {pid} | `{m}` | {tps['median']:.2f} ({tps['min']:.2f}) | {tau} | "
                         f"{' '.join(f'{a:.2f}' for a in depth) or '–'} | "
                         f"{_f(d.get('draft_ms'), '.1f')} | {_f(d.get('verify_ms'), '.1f')} |")
    return lines


def write_markdown(results: dict, out: Path) -> Path:
    path = out / "report.md"
    path.write_text(markdown(results), encoding="utf-8")
    return path
