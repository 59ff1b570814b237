"""`eagle-trt config show|check`: the eagle_config.yaml schema and validation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from eagle_trt.cli.common import JsonOpt, console, handle_errors, print_json

config_app = typer.Typer(help="Inspect the eagle_config.yaml schema or check a config file.", no_args_is_help=True)


@config_app.command("show")
def show(json_out: JsonOpt = False) -> None:
    """Print every eagle_config.yaml field with its type, default and description."""
    from eagle_trt.config import describe_fields

    rows = describe_fields()
    if json_out:
        print_json([{"field": n, "type": t, "default": d, "description": desc} for n, t, d, desc in rows])
        return
    table = Table(title="eagle_config.yaml", title_justify="left")
    for col in ("field", "type", "default", "description"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*[str(c) for c in row])
    console.print(table)


@config_app.command("check")
def check(path: Annotated[Path, typer.Argument(help="Config file to validate.")], json_out: JsonOpt = False) -> None:
    """Validate a config file and print it with every default filled in."""

    def _check() -> None:
        from eagle_trt.config import dump_config, load_config

        cfg = load_config(path)
        if json_out:
            print_json(cfg.model_dump(mode="json"))
        else:
            console.print(dump_config(cfg), end="")

    handle_errors(_check)()
