"""`eagle-trt tune`: measure this machine's verify and draft costs and the head's acceptance, pick the
tree settings with the best expected tokens/s, and store them as the engine's defaults."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from eagle_trt.cli.common import (
    EngineOpt,
    JsonOpt,
    SkipVerifyOpt,
    apply_threads,
    console,
    err_console,
    handle_errors,
    print_json,
    print_wide,
    require_engine,
)
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.errors import EagleError, InputError


def tune(
    engine: EngineOpt,
    prompts: Annotated[str, typer.Option(
        help="Calibration prompts: chat, humaneval or a .jsonl file, or several comma-separated (e.g. "
             "chat,data/code_calibration.jsonl: code stubs held out from the demo head's training).")] = "chat",
    limit: Annotated[int, typer.Option(help="Calibration prompts used per set (round-robin over categories).")] = 6,
    max_new_tokens: Annotated[int, typer.Option(help="AR tokens generated per calibration prompt.")] = 64,
    positions: Annotated[int, typer.Option(
        help="Draft positions scored per prompt: 0 = every one, with each setting's steps following the path "
             "decoding would take (exact tau); N = N evenly spaced ones, averaged (faster, optimistic).")] = 0,
    max_depth: Annotated[int, typer.Option(help="Deepest draft_length considered (at least the engine's).")] = 8,
    beams: Annotated[str, typer.Option(help="Beam widths considered, comma-separated (capped at the "
                                       "engine's beam_width, which is always included).")] = "1,2,4,8",
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (use what you will run with).")] = None,
    validate: Annotated[int, typer.Option(help="Best-predicted settings to run end to end (with the build default); "
                                          "the fastest measured one wins. 0 trusts the prediction alone.")] = 3,
    validate_repeats: Annotated[int, typer.Option(help="Repeats of those end-to-end runs (median).")] = 2,
    lookup_tokens: Annotated[str, typer.Option(
        help="Prompt-lookup copy lengths considered, comma-separated, besides lookup off and the engine's own "
             "setting (0 = consider lookup off only).")] = "4,8,12",
    lookup_branches: Annotated[str, typer.Option(
        help="Copies from the context per step considered, comma-separated.")] = "1,2,3,4",
    datastore_branches: Annotated[str, typer.Option(
        help="Copies from the engine's datastore per step considered, comma-separated (engines with one).")] = "0,1,2",
    max_verify_rows: Annotated[str, typer.Option(
        help="Caps on one verify pass's tokens (root + tree + copies) considered, comma-separated; the copies are "
             "cut to fit. 0 = no cap. A cap pays where the verify cost jumps (bf16 on CPU: at 33 rows).")] = "0,16,24,32",
    confidence_thresholds: Annotated[str, typer.Option(
        help="Confidence thresholds considered, comma-separated, besides 0 (verify the whole tree): a step verifies "
             "only the head's candidates whose draft probability is at least this. Pays where each verify row "
             "costs (4-bit weights on CPUs without AMX); 0 = consider none.")] = "0.1,0.2,0.3,0.4,0.5",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the choice without storing it.")] = False,
    top: Annotated[int, typer.Option(help="Rows of the ranking to print.")] = 10,
    json_out: JsonOpt = False,
    skip_verify: SkipVerifyOpt = False,
) -> None:
    """Choose total_tokens, draft_length, beam_width and confidence_threshold for this machine and store them in
    the engine.

    The ranking maximizes tau / (draft + drafter update + lookup + verify) with every term measured here:
    the verify-cost curve (target forward time against tree tokens), the draft cost per beam width and
    depth, and the acceptance on calibration prompts of the drafter's tree (an EAGLE-3 head's or a draft
    model's) together with the prompt-lookup copies (context and datastore) each lookup setting grafts, and
    the verify rows each step takes (a confidence threshold leaves out the candidates the drafter is unsure
    of). The best few predicted settings, the best one without lookup and the build default are then decoded end to
    end on the same prompts (--validate), each with the plain-decoding fallback on and off, and the
    fastest measured is stored in ENGINE/tuned.json (listed in manifest.json with its hash);
    `eagle-trt run` and `bench` then use it unless options override it.

    Example: eagle-trt tune --engine engines/smollm2-135m-eagle3
    """
    handle_errors(_tune)(engine, prompts, limit, max_new_tokens, positions, max_depth, beams, threads, validate,
                         validate_repeats, (lookup_tokens, lookup_branches, datastore_branches, max_verify_rows),
                         confidence_thresholds, dry_run, top, json_out, skip_verify)


def _tune(engine, prompts, limit, max_new_tokens, positions, max_depth, beams, threads, validate, validate_repeats,
          lookup, confidence_thresholds, dry_run, top, json_out, skip_verify) -> None:
    import torch

    from eagle_trt.bench.prompts import load_prompts
    from eagle_trt.bench.tune import tune_engine
    from eagle_trt.bench.tune_store import check_writable, store_tuned
    from eagle_trt.models import huge_pages
    from eagle_trt.runtime.session import Session

    require_engine(engine)
    if not dry_run:
        check_writable(engine)  # before minutes of measuring, not after
    beam_list, (lookup_tokens, lookup_branches, datastore_branches, caps) = _checked_options(
        max_new_tokens, max_depth, limit, validate, validate_repeats, positions, beams, lookup)
    thresholds = _thresholds(confidence_thresholds)
    apply_threads(threads)
    huge_pages.prefer()  # tune decodes for long, and measures the memory serve and bench decode from
    # The configured trees as they are: tune's model and its end-to-end checks time the settings themselves, on
    # which `run`'s step budget then decides step by step.
    session = Session.open(engine, verify=not skip_verify, budget=False)
    cfg = session.config
    if cfg.backend != "torch":
        raise InputError("eagle-trt tune measures torch engines; this one is built for TensorRT-LLM")
    if max_new_tokens > cfg.max_output_len:
        raise InputError(f"--max-new-tokens {max_new_tokens} exceeds the engine's max_output_len {cfg.max_output_len}")
    encoded = [p.encode(session.tokenizer)[-session.runner.max_input_len:] for p in load_prompts(prompts, limit)]

    def progress(msg: str) -> None:
        if not json_out:
            err_console.print(f"[dim]{msg}[/]", soft_wrap=True)

    result = tune_engine(session, encoded, max_new_tokens, positions, max_depth, beam_list, progress=progress,
                         validate=validate, validate_repeats=validate_repeats,
                         lookup_tokens=lookup_tokens, lookup_branches=lookup_branches,
                         datastore_branches=datastore_branches, max_verify_rows=caps or [0],
                         confidence_thresholds=thresholds)
    best, default, validation = result["best"], result["default"], result["validation"]
    if validation and validation["mismatches"]:
        # A speculative output differed from plain decoding: never store settings from a broken run.
        raise EagleError(f"speculative output differed from plain AR decoding for {validation['mismatches']}; "
                            "nothing stored (this is a bug: please report it with the engine and prompts)")
    stored = None
    if not dry_run:
        info = {"default_predicted_tokens_per_second": round(default["predicted_tokens_per_second"], 3)
                if default else None,
                "ar_predicted_tokens_per_second": round(result["ar_predicted_tokens_per_second"], 3),
                "threads": torch.get_num_threads(), "calibration": f"{prompts} x{len(encoded)}",
                # What the verify-cost curve was measured on: a 4-bit verify row costs other compute than a bf16 one.
                "weights": session.weights, "kernels": session.kernels}
        if validation:
            info["ar_measured_tokens_per_second"] = round(validation["ar_tokens_per_second"], 3)
        stored = str(store_tuned(session.engine.root, best, info))
    if json_out:
        print_json({**result, "ranked": result["ranked"][:top], "stored": stored})
        return
    _report(result, top, session)
    console.print(f"stored in {stored}" if stored else "dry run: nothing stored")


def _checked_options(max_new_tokens, max_depth, limit, validate, validate_repeats, positions, beams, lookup
                     ) -> tuple[list[int], tuple[list[int], ...]]:
    """The numeric options checked (one-line errors naming the option); returns the beam list and the four lookup
    lists (tokens, branches, datastore branches, row caps)."""
    for name, value in (("--max-new-tokens", max_new_tokens), ("--max-depth", max_depth), ("--limit", limit),
                        ("--validate-repeats", validate_repeats)):
        if value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    if positions < 0:
        raise InputError(f"--positions must be >= 0 (0 = every position), got {positions}")
    beam_list = _int_list("--beams", beams)
    if validate < 0:
        raise InputError(f"--validate must be >= 0, got {validate}")
    lists = tuple(_int_list(name, value) for name, value in zip(
        ("--lookup-tokens", "--lookup-branches", "--datastore-branches", "--max-verify-rows"), lookup))
    lookup_tokens, lookup_branches, datastore_branches, caps = lists
    if any(c < 0 for c in caps):
        raise InputError(f"--max-verify-rows must list integers >= 0 (0 = no cap), got {lookup[3]!r}")
    for name, values in (("lookup_tokens", lookup_tokens), ("lookup_branches", lookup_branches),
                         ("datastore_branches", datastore_branches)):
        for value in values:
            DecodeConfig.check_request({name: value})  # each candidate within the one declared bounds
    if not beam_list or min(beam_list) < 1:
        raise InputError(f"--beams must list integers >= 1, got {beams!r}")
    return beam_list, lists


def _report(result: dict, top: int, session) -> None:
    """The ranked table, what was measured, the best setting and any note (AR beat every tree)."""
    best, default, validation = result["best"], result["default"], result["validation"]
    table = Table(title="eagle-trt tune: predicted tokens/s (best first)", title_justify="left")
    table.add_column("", no_wrap=True)
    for col in ("beam", "depth", "total", "p ≥", "lookup", "rows", "τ", "draft ms", "update ms", "verify ms", "tok/s",
                "measured τ", "measured tok/s"):
        table.add_column(col, justify="right")
    rows = result["ranked"][:top]
    for r in [default] + (validation["finalists"] if validation else []):
        if r and r not in rows:
            rows.append(r)
    for r in rows:
        mark = "best" if r is best else ("build default" if r is default else "")
        measured = "measured_tokens_per_second" in r
        table.add_row(mark, str(r["beam_width"]), str(r["draft_length"]), str(r["total_tokens"]),
                      f"{r['confidence_threshold']:g}" if r["confidence_threshold"] else "–", _lookup_label(r),
                      f"{r['verify_rows']:.1f}", f"{r['tau']:.2f}",
                      f"{r['draft_ms']:.1f}", f"{r['extend_ms']:.1f}", f"{r['verify_ms']:.1f}",
                      f"{r['predicted_tokens_per_second']:.1f}", f"{r['measured_tau']:.2f}" if measured else "",
                      f"{r['measured_tokens_per_second']:.1f}" if measured else "")
    print_wide(table)  # fourteen columns: keep them whole in logs too
    m = result["measured"]
    console.print(f"measured on {m['positions']} positions of {m['prompts']} prompts, {m['threads']} threads, "
                  f"in {m['seconds']:.0f}s; per-step overhead {m['step_overhead_ms']:.1f} ms (in every prediction); "
                  f"plain AR predicted {result['ar_predicted_tokens_per_second']:.1f} tok/s", soft_wrap=True)
    if validation:
        console.print(f"end to end ({validation['repeats']} repeats, median): plain AR "
                      f"{validation['ar_tokens_per_second']:.1f} tok/s; every speculative output matched it",
                      soft_wrap=True)
    console.print(_best_line(best, default, validation), soft_wrap=True)
    if validation and validation["ar_tokens_per_second"] > best["measured_tokens_per_second"]:
        console.print(f"[yellow]note:[/] plain AR decoding ({validation['ar_tokens_per_second']:.1f} tok/s) beat every "
                      f"tree setting with this drafter (τ {best['measured_tau']:.2f}); {_better_drafter(session)}, "
                      "or run with --mode ar")
    elif not validation and result["ar_predicted_tokens_per_second"] > best["predicted_tokens_per_second"]:
        console.print(f"[yellow]note:[/] plain AR decoding ({result['ar_predicted_tokens_per_second']:.1f} tok/s "
                      f"predicted) beats every tree setting with this drafter (τ {best['tau']:.2f}); "
                      f"{_better_drafter(session)}, or run with --mode ar")


def _best_line(best: dict, default: dict | None, validation: dict | None) -> str:
    if validation:
        line = (f"best: beam_width={best['beam_width']} draft_length={best['draft_length']} "
                f"total_tokens={best['total_tokens']} confidence_threshold={best['confidence_threshold']:g} "
                f"fallback_after={best['fallback_after']} "
                f"lookup_tokens={best['lookup_tokens']} lookup_branches={best['lookup_branches']} "
                f"datastore_branches={best['datastore_branches']} max_verify_rows={best['max_verify_rows']} "
                f"({best['measured_tokens_per_second']:.1f} tok/s measured, "
                f"{best['measured_tokens_per_second'] / validation['ar_tokens_per_second']:.2f}x AR")
        return line + (f"; build default {default['measured_tokens_per_second']:.1f})" if default else ")")
    line = (f"best: beam_width={best['beam_width']} draft_length={best['draft_length']} "
            f"total_tokens={best['total_tokens']} confidence_threshold={best['confidence_threshold']:g} "
            f"lookup {_lookup_label(best)} "
            f"({best['predicted_tokens_per_second']:.1f} tok/s predicted")
    return line + (f", build default {default['predicted_tokens_per_second']:.1f})" if default else ")")


def _better_drafter(session) -> str:
    return "try a larger or closer draft model" if session.draft_kind == "model" else "train the head"


def _thresholds(text: str) -> list[float]:
    """--confidence-thresholds as floats, each in [0, 1) as DecodeConfig.confidence_threshold is."""
    values = _int_list("--confidence-thresholds", text, float)
    if any(not 0.0 <= v < 1.0 for v in values):
        raise InputError(f"--confidence-thresholds must lie in [0, 1), got {text!r}")
    return values


def _int_list(name: str, text: str, kind=int) -> list:
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise InputError(f"{name} must be comma-separated {what}, got {text!r}") from None


def _lookup_label(row: dict) -> str:
    """Lookup setting as copy length x context branches + datastore branches ("off" when lookup is off)."""
    if not row["lookup_tokens"]:
        return "off"
    cap = f" ≤{row['max_verify_rows']}" if row.get("max_verify_rows") else ""
    return f"{row['lookup_tokens']}x{row['lookup_branches']}+{row['datastore_branches']}{cap}"
