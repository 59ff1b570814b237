"""`eagle-trt inspect`: print an engine's manifest (after checking its files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.syntax import Syntax

from eagle_trt.architectures import family_label
from eagle_trt.cli.common import EXIT_CODES_HELP, JsonOpt, SkipVerifyOpt, console, handle_errors, print_json


def inspect(
    engine: Annotated[Path, typer.Argument(help="Engine dir written by `eagle-trt build`.")],
    json_out: JsonOpt = False,
    skip_verify: SkipVerifyOpt = False,
) -> None:
    """Verify an engine's files against its manifest (sizes and sha256) and print the manifest.

    A tampered, truncated or half-written engine is refused with the file it concerns.

    Example: eagle-trt inspect engines/smollm2-135m-eagle3
    """
    handle_errors(_inspect)(engine, json_out, skip_verify)


inspect.__doc__ += "\n\n    " + EXIT_CODES_HELP  # indented like the docstring, so help dedents it


def _inspect(engine, json_out, skip_verify) -> None:
    from eagle_trt.engine.engine_dir import open_engine

    eng = open_engine(engine, verify=not skip_verify, rehash=True)
    manifest = eng.manifest.model_dump(mode="json")
    family = family_label(manifest["target"]["architecture"])
    if json_out:
        manifest = {**manifest, "family": family}
        if "trtllm.json" in manifest["files"]:  # the TensorRT-LLM line beside the manifest
            from eagle_trt.engine.trtllm_bundle import read_meta

            manifest = {**manifest, "trtllm": read_meta(eng.root)}
        print_json(manifest)
        return
    console.print(Syntax(json.dumps(manifest, indent=2), "json", word_wrap=True))
    console.print(f"family: {family} ({manifest['target']['architecture']})", markup=False)
    console.print(f"[green]{'files not verified (--skip-verify)' if skip_verify else 'all file hashes match'}[/]")
    if "trtllm.json" in manifest["files"]:
        from eagle_trt.engine.trtllm_bundle import read_meta

        meta = read_meta(eng.root)
        console.print(f"TensorRT-LLM line {meta['trtllm_version']} ({meta['releases']}): EAGLE-3 {meta['tree']}, "
                      f"max_draft_len {meta['max_draft_len']}, served as '{meta['served_model_name']}'", markup=False)
    if "serve.sh" in manifest["files"]:
        console.print(f"TensorRT-LLM: {Path(engine) / 'serve.sh'} serves it (trtllm-serve, PyTorch backend)")
    elif "legacy_trt/trtllm_build.sh" in manifest["files"]:
        console.print(f"TensorRT-LLM: {Path(engine) / 'legacy_trt' / 'trtllm_build.sh'} builds its TensorRT engine")
