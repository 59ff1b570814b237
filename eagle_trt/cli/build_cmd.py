"""`eagle-trt build`: checkpoint + eagle_config.yaml -> engine dir (atomic, hashed, deterministic)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from eagle_trt.cli.common import (DEFAULT_SHARD_SIZE, EXIT_CODES_HELP, JsonOpt, MaxShardOpt, console, err_console,
                                  handle_errors, print_json)


def build(
    config: Annotated[Path, typer.Option("--config", "-c", help="eagle_config.yaml (see `eagle-trt config show`).")],
    checkpoint: Annotated[Optional[Path], typer.Option(
        help="Checkpoint dir from `eagle-trt convert` (overrides checkpoint_dir in the config).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Engine dir (default engines/<name>).")] = None,
    backend: Annotated[Optional[str], typer.Option(
        help="torch or trtllm (overrides backend in the config). trtllm also writes extra_llm_api_options.yaml, "
        "serve.sh and bench.sh for TensorRT-LLM, and validates them where TensorRT-LLM and a GPU exist.")] = None,
    trtllm_version: Annotated[Optional[str], typer.Option(
        "--trtllm-version", help='TensorRT-LLM release line the trtllm bundle is for: 1.2 (1.2.0rc7 to 1.2.x and '
        '1.3 rcs before rc10; EAGLE-3 runs a chain) or 1.3+ (1.3.0rc10 and later, 1.4, main; dynamic trees). '
        'Overrides trtllm_version; default 1.3+.')] = None,
    tensor_parallel_size: Annotated[Optional[int], typer.Option(
        "--tensor-parallel-size", "--tp", help="GPUs each layer is split across (backend trtllm; overrides "
        "tensor_parallel_size). Must divide the attention heads.")] = None,
    pipeline_parallel_size: Annotated[Optional[int], typer.Option(
        "--pipeline-parallel-size", "--pp", help="Pipeline stages (backend trtllm; overrides pipeline_parallel_size). "
        "GPUs used: tp x pp.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check everything (paths, head vs target shapes, "
                                          "dtypes and tree limits of the backend); write nothing.")] = False,
    max_shard_size: MaxShardOpt = DEFAULT_SHARD_SIZE,
    json_out: JsonOpt = False,
) -> None:
    """Build an engine dir: weights, tokenizer, manifest.json with sha256 of every file.

    Weights: a GGUF checkpoint keeps the file's own blocks (weights: auto, the default), a float one stays in the
    engine dtype; the config's weights: float, q8_0, q4_k, ... say otherwise (backend trtllm: float always).

    The write is atomic (temp dir, then rename): a failed build leaves any previous engine untouched.
    The same inputs give byte-identical files. --json prints one JSON object: engine dir, backend,
    dtypes, per-file bytes and sha256, build seconds.

    Example: eagle-trt build --config configs/eagle_config.yaml --checkpoint checkpoints/smollm2 --json
    """
    parallel = {"tensor_parallel_size": tensor_parallel_size, "pipeline_parallel_size": pipeline_parallel_size}
    handle_errors(_build)(config, checkpoint, output, backend, trtllm_version, dry_run, json_out, max_shard_size,
                          parallel)  # fmt: skip


build.__doc__ += "\n\n    " + EXIT_CODES_HELP  # indented like the docstring, so help dedents it


def _build(config, checkpoint, output, backend, trtllm_version, dry_run, json_out, max_shard_size, parallel) -> None:
    from dataclasses import asdict

    from eagle_trt.config import load_config, override_config
    from eagle_trt.engine.builder import build_engine

    cfg = override_config(load_config(config), {"backend": backend}, source="--backend")
    cfg = override_config(cfg, {"trtllm_version": trtllm_version}, source="--trtllm-version")
    cfg = override_config(cfg, parallel, source="--tensor-parallel-size / --pipeline-parallel-size")
    from eagle_trt.runtime.session import warm_runtime_layout

    summary = build_engine(cfg, checkpoint_dir=checkpoint, output_dir=output, dry_run=dry_run,
                           max_shard_size=max_shard_size, warm=warm_runtime_layout)
    for warning in summary.warnings:
        err_console.print(f"Warning: {warning}", soft_wrap=True, markup=False)
    if summary.trtllm is not None and not summary.trtllm["validated"]:
        err_console.print(f"Not validated on TensorRT-LLM: {summary.trtllm['reason']}; the bundle was written "
                          "and is ready for a machine that has it.", soft_wrap=True, markup=False)
    data = asdict(summary)
    if json_out:
        print_json(data)
        return
    if dry_run:
        console.print(f"[green]Dry run OK:[/] {summary.engine_dir} would be built "
                      f"({summary.backend}, {summary.head}, {summary.dtype}, kv {summary.kv_cache_dtype}); nothing written")
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
    if summary.trtllm is not None:
        console.print(f"TensorRT-LLM line {summary.trtllm['trtllm_version']}: EAGLE-3 {summary.trtllm['tree']} "
                      f"(trtllm.json); check it on a GPU machine with {summary.engine_dir}/validate.py", markup=False)
    if summary.trtllm is not None and summary.trtllm["validated"]:
        console.print(f"[green]Validated on TensorRT-LLM {summary.trtllm['tensorrt_llm']}[/] (loaded with LLM(...))")
