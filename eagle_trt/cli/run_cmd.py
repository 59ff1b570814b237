"""`eagle-trt run`: generate from an engine, streaming text, then a metrics table."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.table import Table

from eagle_trt.cli.common import (
    EngineOpt,
    JsonOpt,
    SkipVerifyOpt,
    ThreadsOpt,
    apply_threads,
    console,
    handle_errors,
    print_json,
    require_engine,
)
from eagle_trt.config.decode import DecodeConfig


def run(
    engine: EngineOpt,
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Text to continue. With --chat (default) it is sent "
                                        "as one user turn through the tokenizer's chat template.")],
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Stop after this many new tokens (default: "
                                                          "min(128, engine max_output_len)).")] = None,
    mode: Annotated[str, typer.Option(help="eagle: speculative decoding with the engine's drafter (an EAGLE-3 head "
                                      "or a draft model); ar: plain autoregressive decoding (the reference the "
                                      "eagle output equals, token for token).")] = "eagle",
    tree: Annotated[Optional[str], typer.Option(help="dynamic (EAGLE-2 reranked tree), static (fixed choices "
                                                "list) or chain (one path). Default: the engine's.")] = None,
    draft_length: Annotated[Optional[int], typer.Option(help="Tree depth: draft tokens per path.")] = None,
    beam_width: Annotated[Optional[int], typer.Option(help="Top-k children expanded per node (dynamic tree).")] = None,
    total_tokens: Annotated[Optional[int], typer.Option(help="Draft tokens kept in the tree (root excluded).")] = None,
    confidence_threshold: Annotated[Optional[float], typer.Option(
        help="Drop branches whose cumulative draft probability is below this (0 keeps all).")] = None,
    lookup_tokens: Annotated[Optional[int], typer.Option(
        help="Prompt lookup: also verify up to this many tokens copied from the context where the last tokens "
             "occurred before (0 = off). Lossless; helps code and extraction. Default: the engine's.")] = None,
    lookup_branches: Annotated[Optional[int], typer.Option(
        help="Distinct copied continuations per tree (prompt lookup). Default: the engine's.")] = None,
    datastore_branches: Annotated[Optional[int], typer.Option(
        help="More copied continuations from the draft's datastore (engines built with one), the most frequent "
             "after the last tokens; 0 = off. Default: the engine's.")] = None,
    max_verify_rows: Annotated[Optional[int], typer.Option(
        help="Cut the copies so one verify pass holds at most this many tokens (root + tree + copies); 0 = no "
             "cut. Default: the engine's (tuned).")] = None,
    adaptive_lookup: Annotated[Optional[bool], typer.Option(
        "--adaptive-lookup/--no-adaptive-lookup",
        help="Greedy: cut each copy where its yield so far stops paying for its verify rows (lossless either "
             "way). Default: the engine's (on).")] = None,
    temperature: Annotated[float, typer.Option(
        help="Sampling temperature; 0 = greedy. At T > 0 the tree is verified by multi-branch rejection "
             "sampling: the output distribution equals the target's exactly.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass, applied to the target (1 = off).")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Keep the k most likely target tokens (0 = off).")] = 0,
    seed: Annotated[Optional[int], typer.Option(help="Random seed for sampling (reproducible runs).")] = None,
    posterior_threshold: Annotated[Optional[float], typer.Option(
        help="LOSSY, opt-in: typical acceptance (TensorRT-LLM's posterior_threshold). Accept a draft token "
             "when the target gives it more than min(threshold, 0.3*exp(-entropy)); output no longer "
             "follows the target's distribution exactly.")] = None,
    fallback_after: Annotated[Optional[int], typer.Option(
        help="After this many verify steps in a row with no draft token accepted, decode plainly for a "
             "while (0 = never). Lossless either way. Default: the engine's tuned value, else 2.")] = None,
    fallback_tokens: Annotated[int, typer.Option(help="Tokens decoded plainly per fallback.")] = 8,
    chat: Annotated[bool, typer.Option("--chat/--no-chat", help="Apply the chat template; --no-chat encodes the "
                                       "prompt exactly as tokenizer(prompt).input_ids.")] = True,
    json_out: JsonOpt = False,
    skip_verify: SkipVerifyOpt = False,
    threads: ThreadsOpt = None,
) -> None:
    """Generate text with an engine and report acceptance length, tokens/s and the draft/verify time split.

    Greedy output is token-identical to `--mode ar`.

    Example: eagle-trt run --engine engines/smollm2-135m-eagle3 --prompt "Write a haiku about the sea"
    """
    request = dict(max_new_tokens=max_new_tokens, mode=mode, tree=tree, draft_length=draft_length,
                   beam_width=beam_width, total_tokens=total_tokens, confidence_threshold=confidence_threshold,
                   lookup_tokens=lookup_tokens, lookup_branches=lookup_branches, datastore_branches=datastore_branches,
                   max_verify_rows=max_verify_rows, adaptive_lookup=adaptive_lookup, temperature=temperature,
                   top_p=top_p, top_k=top_k, seed=seed, posterior_threshold=posterior_threshold,
                   fallback_after=fallback_after, fallback_tokens=fallback_tokens)
    handle_errors(_run)(engine, prompt, request, chat=chat, json_out=json_out, skip_verify=skip_verify,
                        threads=threads)


def _run(engine, prompt: str, request: dict, *, chat: bool, json_out: bool, skip_verify: bool,
         threads: int | None) -> None:
    """request: the DecodeConfig fields the flags give (None = the engine's); each is checked before the engine
    loads, and all of them with the engine's settings once it has (config/decode.py)."""
    # Imported here: the session pulls in torch, which `eagle-trt --help` and the other commands should not wait for.
    from eagle_trt.runtime.session import Session, TextStream, check_prompt_text

    apply_threads(threads)
    DecodeConfig.check_request(request)
    check_prompt_text(prompt)
    require_engine(engine)

    session = Session.open(engine, verify=not skip_verify)
    opts = session.decode_config(**request)
    ids = session.encode(prompt, chat=chat)
    stream = TextStream(session.tokenizer)

    def on_tokens(tokens: list[int]) -> None:
        if not json_out:
            sys.stdout.write(stream.push(tokens))
            sys.stdout.flush()

    result = session.runner.generate(ids, opts, on_tokens=on_tokens)
    text = session.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    metrics = result.metrics.to_dict()
    reasons = (["typical acceptance (--posterior-threshold)"] if opts.lossy else []) + (
        ["fp8 KV cache"] if session.config.kv_cache_dtype == "fp8" else [])
    metrics["lossy"], metrics["lossy_reasons"] = bool(reasons), reasons
    metrics["lossless"], metrics["lossless_note"] = lossless(session, opts, reasons)
    metrics["kernels"] = session.kernels
    metrics["weights"] = session.weights
    metrics["draft_weights"] = session.draft_weights if opts.mode == "eagle" else None
    metrics["block_compute"] = session.block_compute
    metrics["drafter"] = session.draft_kind if opts.mode == "eagle" else None
    if json_out:
        print_json({"text": text, "token_ids": result.token_ids, "prompt_token_ids": ids,
                    "options": opts.model_dump(exclude={"eos_token_ids"}), "metrics": metrics})
        return
    sys.stdout.write("\n")
    console.print(metrics_table(metrics))


def lossless(session, opts, lossy_reasons: list[str]) -> tuple[bool, str]:
    """Whether this output is guaranteed to be what plain decoding of the engine gives (greedy: token for token;
    sampling: the target's distribution exactly), and what the guarantee rests on."""
    if lossy_reasons:
        return False, "lossy by choice: " + ", ".join(lossy_reasons)
    if opts.mode == "ar":
        return True, "plain decoding"
    target = getattr(session.runner, "target", None)  # None: TensorRT-LLM runs the engine
    if target is None:
        return False, ("TensorRT-LLM verifies with other kernels than it decodes with; outputs match plain decoding "
                       "except where a last-bit difference flips a near-tie")
    if getattr(target, "row_invariant", False):
        return True, "every verify row is bit-identical to decoding its token alone (row-invariant kernels)"
    return False, ("verify and decoding take kernels that may differ in the last bit on this engine, so a near-tie "
                   "can flip a token (rare; `bench` compares every output with plain decoding)")


def metrics_table(m: dict) -> Table:
    mode = "draft-model" if m["mode"] == "eagle" and m.get("drafter") == "model" else m["mode"]
    title = f"{mode} decoding" + (f", T={m['temperature']:g}" if m.get("temperature") else "")
    if m.get("lossy"):
        title += f" [LOSSY: {', '.join(m['lossy_reasons'])}]"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("generated tokens", str(m["generated_tokens"]))
    if m.get("kernels"):
        table.add_row("kernels", m["kernels"])
    if m.get("weights"):
        table.add_row("weights", m["weights"] + (f" ({m['block_compute']})" if m.get("block_compute") else ""))
    table.add_row("tokens/s", f"{m['tokens_per_second']:.2f}")
    tau = m["acceptance_length"]
    table.add_row("acceptance length τ", "not reported" if tau is None else f"{tau:.2f}")
    if m["acceptance_per_depth"]:
        table.add_row("acceptance by depth", " ".join(f"{a:.2f}" for a in m["acceptance_per_depth"]))
    table.add_row("verify steps", "not reported" if m["verify_steps"] is None else str(m["verify_steps"]))
    table.add_row("prefill ms", f"{m['prefill_ms']:.1f}")
    table.add_row("draft ms / verify ms", f"{m['draft_ms']:.1f} / {m['verify_ms']:.1f}")
    if m["mean_tree_size"]:
        table.add_row("tree size (mean) / utilization", f"{m['mean_tree_size']:.1f} / {m['tree_utilization']:.1%}")
    if m.get("rejections"):
        table.add_row("rejected draft tokens", str(m["rejections"]))
    if m.get("fallbacks"):
        table.add_row("fallbacks / plain tokens", f"{m['fallbacks']} / {m['fallback_tokens']}")
    if m.get("lookup_tokens_verified"):
        table.add_row("prompt lookup: accepted / verified",
                      f"{m['lookup_tokens_accepted']} / {m['lookup_tokens_verified']}")
    if m.get("datastore_tokens_verified"):
        table.add_row("  of which datastore: accepted / verified",
                      f"{m['datastore_tokens_accepted']} / {m['datastore_tokens_verified']}")
    table.add_row("stop", m["stop_reason"])
    return table
