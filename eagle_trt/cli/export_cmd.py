"""`eagle-trt export`: a head in the layout another serving engine loads (vLLM, SGLang, speculators, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle_trt.cli.common import EXIT_CODES_HELP, JsonOpt, console, err_console, handle_errors, print_json


def export(
    source: Annotated[Path, typer.Argument(help="Checkpoint (convert), engine (build) or head dir with the head.")],
    fmt: Annotated[str, typer.Option("--format", help="vllm, sglang, speculators, trtllm or modelopt.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Head dir to write.")],
    target: Annotated[Optional[str], typer.Option(
        "--target", help="The target's HF id or path (default: where a checkpoint's target came from): recorded in "
                         "eagle_trt.json and as speculators' verifier, which `vllm serve` loads as the target.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it already exists.")] = False,
    measure_tau: Annotated[int, typer.Option(
        "--measure-tau", help="SOURCE an engine: decode N shipped chat prompts with the head computed eagle-trt's way "
                              "and FORMAT's way, and record both tau in eagle_trt.json (0 = off).", min=0)] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Write the head of SOURCE as FORMAT's engine loads it: the layer ids that engine reads for the same target
    layers, its tensor names, vocab maps and norm flags, and eagle_trt.json (the target it belongs to; `convert
    --head` reads it back). Where the engine computes the head differently, export says so and what it costs.

    Example: eagle-trt export engines/smollm2-135m-eagle3 --format vllm --output /tmp/smol-vllm
    """
    handle_errors(_export)(source, fmt, output, target, force, measure_tau, json_out)


export.__doc__ += "\n\n    " + EXIT_CODES_HELP


def _export(source, fmt, output, target, force, measure_tau, json_out) -> None:
    from eagle_trt.interop.export import export_head

    note = export_head(source, fmt, output, overwrite=force, measure_prompts=measure_tau, target_name=target)
    if json_out:
        print_json(dict(note, output=str(output)))
        return
    console.print(f"[green]Head written for {note['engine']}:[/] {output} (layer ids {note['engine_aux_layer_ids']}, "
                  f"eagle-trt's {note['aux_layer_ids']})")
    if note["cost"]:
        err_console.print(f"[yellow]not exact:[/] {note['cost']}")
    if "tau" in note:
        taus = ", ".join(f"{k} {v['chain']} / {v['dynamic']}" for k, v in note["tau"].items() if k != "prompts")
        console.print(f"tau (chain / dynamic tree) on {note['tau']['prompts']}: {taus}")
