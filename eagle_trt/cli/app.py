"""Composition root of the `eagle-trt` command line: one module per command.

    eagle-trt convert MODEL --output DIR       attach (and train) an EAGLE-3 head
    eagle-trt build --config eagle_config.yaml build an engine dir
    eagle-trt run --engine DIR --prompt TEXT   generate with speculative decoding
    eagle-trt inspect DIR                      verify and print an engine's manifest
    eagle-trt config show                      every config field, documented
"""

from __future__ import annotations

import typer

from eagle_trt import __version__
from eagle_trt.cli.bench_cmd import bench
from eagle_trt.cli.bench_serve_cmd import bench_serve
from eagle_trt.cli.build_cmd import build
from eagle_trt.cli.common import EXIT_CODES_HELP
from eagle_trt.cli.config_cmd import config_app
from eagle_trt.cli.convert_cmd import convert
from eagle_trt.cli.export_cmd import export
from eagle_trt.cli.inspect_cmd import inspect
from eagle_trt.cli.run_cmd import run
from eagle_trt.cli.serve_cmd import serve
from eagle_trt.cli.tune_cmd import tune

app = typer.Typer(
    name="eagle-trt",
    help="Lossless EAGLE-3 speculative decoding: convert a Hugging Face model, build an engine, run it.\n\n"
    + EXIT_CODES_HELP + " Set EAGLE_TRT_DEBUG=1 for tracebacks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command()(convert)
app.command()(build)
app.command()(export)
app.command()(run)
app.command()(serve)
app.command()(inspect)
app.command()(bench)
app.command("bench-serve")(bench_serve)
app.command()(tune)
app.add_typer(config_app, name="config")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"eagle-trt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


def main() -> None:
    app()
