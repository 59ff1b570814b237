"""`eagle-trt build`: checkpoint + eagle_config.yaml -> engine dir (atomic, hashed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from eagle_trt.cli.common import EXIT_CODES_HELP, JsonOpt, console, handle_errors, print_json


def build(
    config: Annotated[Path, typer.Option("--config", "-c", help="eagle_config.yaml (see `eagle-trt config show`).")],
    checkpoint: Annotated[Optional[Path], typer.Option(
        help="Checkpoint dir from `eagle-trt convert` (overrides checkpoint_dir in the config).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Engine dir (default engines/<name>).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check everything, write nothing.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Build an engine dir: weights in the engine dtype, tokenizer, manifest.json with sha256 of every file.

    The write is atomic (temp dir, then rename): a failed build leaves any previous engine untouched.

    Example: eagle-trt build --config configs/eagle_config.yaml --checkpoint checkpoints/smollm2
    """
    handle_errors(_build)(config, checkpoint, output, dry_run, json_out)


build.__doc__ += "\n\n" + EXIT_CODES_HELP


def _build(config, checkpoint, output, dry_run, json_out) -> None:
    from dataclasses import asdict

    from eagle_trt.config import load_config
    from eagle_trt.engine.builder import build_engine

    cfg = load_config(config)
    summary = build_engine(cfg, checkpoint_dir=checkpoint, output_dir=output, dry_run=dry_run)
    data = asdict(summary)
    if json_out:
        print_json(data)
        return
    if dry_run:
        console.print(f"[green]Dry run OK:[/] {summary.engine_dir} would be built (nothing written)")
        return
    table = Table(title=f"engine {summary.engine_dir}", title_justify="left")
    table.add_column("file")
    table.add_column("bytes", justify="right")
    table.add_column("sha256")
    for path, info in sorted(data["files"].items()):
        table.add_row(path, f"{info['bytes']:,}", info["sha256"][:16] + "…")
    console.print(table)
    console.print(f"[green]Built[/] {summary.engine_dir} ({summary.backend}, {summary.dtype}, "
                  f"kv {summary.kv_cache_dtype}) in {summary.seconds:.1f}s")
    if getattr(summary, "message", None):
        console.print(summary.message)
