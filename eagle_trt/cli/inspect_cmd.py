"""`eagle-trt inspect`: print an engine's manifest (after checking its files)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.syntax import Syntax

from eagle_trt.cli.common import JsonOpt, SkipVerifyOpt, console, handle_errors, print_json
from pathlib import Path


def inspect(
    engine: Annotated[Path, typer.Argument(help="Engine dir written by `eagle-trt build`.")],
    json_out: JsonOpt = False,
    skip_verify: SkipVerifyOpt = False,
) -> None:
    """Verify an engine's files against its manifest and print the manifest.

    Example: eagle-trt inspect engines/smollm2-135m-eagle3
    """
    handle_errors(_inspect)(engine, json_out, skip_verify)


def _inspect(engine, json_out, skip_verify) -> None:
    from eagle_trt.engine.engine_dir import open_engine

    eng = open_engine(engine, verify=not skip_verify)
    manifest = eng.manifest.model_dump(mode="json") if hasattr(eng.manifest, "model_dump") else eng.manifest
    if json_out:
        print_json(manifest)
        return
    console.print(Syntax(json.dumps(manifest, indent=2), "json", word_wrap=True))
    console.print(f"[green]{'files not verified' if skip_verify else 'all file hashes match'}[/]")
