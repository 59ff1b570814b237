"""`eagle-trt convert`: HF model dir or GGUF file -> checkpoint with an EAGLE-3 draft head."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle_trt.cli.common import JsonOpt, console, handle_errors, print_json


def convert(
    model: Annotated[Path, typer.Argument(help="HF model dir (config.json + *.safetensors) or a .gguf file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Checkpoint dir to write (target/ + draft/).")],
    steps: Annotated[int, typer.Option(help="Training steps for the head (0 = untrained head, for testing).")] = 0,
    draft_vocab_size: Annotated[Optional[int], typer.Option(
        help="Reduce the head's vocabulary to this many tokens (default: the target's).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it already exists.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Attach an EAGLE-3 draft head (NVIDIA modelopt) to MODEL and export target + draft.

    Example: eagle-trt convert models/SmolLM2-135M-Instruct.Q4_1.gguf --output checkpoints/smollm2 --steps 0
    """
    handle_errors(_convert)(model, output, steps, draft_vocab_size, force, json_out)


def _convert(model, output, steps, draft_vocab_size, force, json_out) -> None:
    from eagle_trt.convert import convert_model

    result = convert_model(model, output, steps=steps, draft_vocab_size=draft_vocab_size, overwrite=force,
                           progress=not json_out)
    if json_out:
        print_json(result.summary)
    else:
        console.print(f"[green]Checkpoint written:[/] {result.output_dir}")
