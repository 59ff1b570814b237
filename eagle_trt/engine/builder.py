"""`eagle-trt build`: check a converted checkpoint against the config, then write an engine dir.

All checks run before anything is written (dry_run stops there): paths, head vs target shapes
(eagle_trt.engine.checkpoint), and what the backend supports (dtypes, tree limits). The engine is
written into a hidden temp dir next to the output, verified against its own manifest, for backend
trtllm loaded through TensorRT-LLM where that is possible, and only then renamed into place, so an
interrupted or failed build never leaves a half-written engine where `eagle-trt run` looks.

    >>> from eagle_trt.config import load_config
    >>> from eagle_trt.engine.builder import build_engine
    >>> cfg = load_config("configs/eagle_config.yaml")           # doctest: +SKIP
    >>> build_engine(cfg, dry_run=True).message                  # doctest: +SKIP
    "dry run: checkpoint 'checkpoints/smollm2-135m-instruct' passed all checks; nothing written"
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eagle_trt.config import EagleConfig, dump_config
from eagle_trt.engine import trtllm_bundle
from eagle_trt.engine.checkpoint import KV_SCALES_NAME, CheckpointPlan, inspect_checkpoint
from eagle_trt.engine.datastore_file import write_indexed
from eagle_trt.engine.engine_dir import open_engine
from eagle_trt.engine.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    DraftInfo,
    IoLimits,
    Manifest,
    TargetInfo,
    TreeLimits,
    hash_files,
    library_versions,
    write_manifest,
)
from eagle_trt.engine.weight_copy import copy_weights, save_weights
from eagle_trt.eos import disagreement
from eagle_trt.errors import ConfigError, InputError, MissingDependencyError
from eagle_trt.staging import check_apart, staged_dir, swap_into_place, sweep_stale

__all__ = ["BuildSummary", "build_engine", "inspect_checkpoint"]

# Fixed safetensors header metadata: nothing build-specific (time, host, path) may reach the
# weight files, so the same inputs always give byte-identical files and hashes.


@dataclass
class BuildSummary:
    """What build_engine did. files: {relative path: {"bytes", "sha256"}} (empty on a dry run).

    trtllm (backend trtllm only): {"validated": bool, "reason": why not, "tensorrt_llm": version}.
    """

    engine_dir: Path
    backend: str
    dtype: str
    kv_cache_dtype: str
    head: str = "eagle3"
    files: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0
    validated: bool = False  # dry run: all checks passed; build: also re-verified from disk
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    trtllm: dict | None = None
    runtime_layout: str | None = None  # torch backend: the weights' layout for this machine's kernels, made here


def build_engine(
    cfg: EagleConfig,
    checkpoint_dir: str | Path | None = None,
    output_dir: str | Path | None = None,
    dry_run: bool = False,
    overwrite: bool = True,
    max_shard_size: str | int = "5GB",
    warm: Callable[[Path], str | None] | None = None,
) -> BuildSummary:
    """Build engines/<cfg.name> (or output_dir) from checkpoint_dir (or cfg.checkpoint_dir); weight files larger
    than max_shard_size are split into shards. `warm(engine)`, for a torch engine once it is in place: open it once so
    the weight cache holds its runtime layout (the runtime's `warm_runtime_layout`; the CLI passes it, as the engine
    layer does not import the runtime above it); returns the kernels' name or None."""
    from eagle_trt.safetensors_stream import parse_size

    from eagle_trt import private_cache

    start = time.monotonic()
    try:
        max_shard_bytes = parse_size(max_shard_size)
    except ValueError as e:
        raise InputError(f"--max-shard-size: {e}") from None
    private_cache.check_settings()  # before the build, not after it (the layout is stored at the end)
    if checkpoint_dir is None and cfg.checkpoint_dir is None:
        raise InputError(
            "no checkpoint dir: set checkpoint_dir in the config or pass --checkpoint",
            hint="create one with `eagle-trt convert`",
        )
    ckpt = Path(checkpoint_dir if checkpoint_dir is not None else cfg.checkpoint_dir)
    out = Path(output_dir) if output_dir is not None else Path("engines") / cfg.name
    check_apart(ckpt, out, "the checkpoint being built")  # replacing OUT must not touch the checkpoint
    _check_output(out, overwrite)
    cfg = cfg.with_dtype(bf16_is_fast)
    warnings = check_backend(cfg)
    plan = inspect_checkpoint(cfg, ckpt)
    warnings = _checkpoint_warnings(cfg, ckpt, plan, warnings)
    resolved = cfg.model_copy(
        update={
            "checkpoint_dir": str(ckpt),
            "eagle_architecture": plan.architecture,
            "draft": plan.draft_config,
            "kv_cache_dtype": cfg.resolved_kv_cache_dtype,
        }
    )
    summary = BuildSummary(out, cfg.backend, cfg.dtype, resolved.kv_cache_dtype, plan.head_kind, warnings=warnings)
    if dry_run:
        summary.validated = True
        summary.message = f"dry run: checkpoint '{ckpt}' passed all checks; nothing written"
        summary.seconds = time.monotonic() - start
        return summary

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(out.parent, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable")
        sweep_stale(out, ("tmp", "old"))  # what builds killed outright left behind
    except OSError as e:
        raise InputError(f"cannot write the engine '{out}' ({e.strerror}: {out.parent}); choose another --output or "
                         "fix its permissions") from None
    with staged_dir(out, "tmp") as tmp:
        manifest = _write_engine(resolved, plan, tmp, max_shard_bytes)
        open_engine(tmp, verify=True)  # read back what we wrote before it replaces anything
        if cfg.backend == "trtllm":
            from eagle_trt.engine.trtllm_backend import validate_bundle

            summary.trtllm = validate_bundle(tmp)  # loads it through LLM(...) where TensorRT-LLM can run
        swap_into_place(tmp, out)
    if cfg.backend == "torch" and warm is not None:
        summary.runtime_layout = warm(out)
    summary.files = {k: v.model_dump() for k, v in manifest.files.items()}
    summary.validated = True
    summary.seconds = time.monotonic() - start
    total = sum(v.bytes for v in manifest.files.values())
    summary.message = f"built '{out}' ({len(manifest.files)} files, {total / 2**20:.1f} MiB, {cfg.dtype})"
    return summary


def _checkpoint_warnings(cfg: EagleConfig, ckpt: Path, plan, warnings: list[str]) -> list[str]:
    """`warnings` and what this checkpoint's files and the backend make of each other: end tokens the files disagree
    on (a warning), and for TensorRT-LLM the family, the head and the parallel layout (refused with a ConfigError,
    or warned about)."""
    eos_warning = disagreement(ckpt / "target")
    warnings = warnings + ([eos_warning] if eos_warning else [])
    if cfg.backend == "trtllm":
        trtllm_bundle.check_trtllm_family(plan.target_info["architecture"], plan.head_kind)
        if plan.engine_draft_config.get("norm_before_residual"):
            # TensorRT-LLM's EAGLE-3 layer takes the raw feature as the residual: it would run another head
            raise ConfigError(f"{ckpt}/draft/config.json: norm_before_residual is true (the layer's residual is the "
                              "normed feature), which TensorRT-LLM does not compute; build this head with backend torch")
        warnings = trtllm_bundle.check_trtllm_head(cfg, plan.head_kind) + warnings
        warnings += trtllm_bundle.check_trtllm_parallel(cfg, plan.target_config, plan.engine_draft_config)
    return warnings


def bf16_is_fast() -> bool:
    """Whether a bf16 torch engine is the faster one on this machine (what dtype: auto builds): a GPU, or the
    compiled CPU kernels (bf16 storage halves the bytes a memory-bound token step reads), or hardware bf16."""
    import torch

    from eagle_trt.models.kernels import cpu_has_native_bf16

    return torch.cuda.is_available() or cpu_has_native_bf16()


def check_backend(cfg: EagleConfig) -> list[str]:
    """What the config's backend cannot do is an error here, before any file is read; returns warnings."""
    if cfg.backend == "trtllm":
        return trtllm_bundle.check_trtllm_config(cfg)
    if cfg.tensor_parallel_size * cfg.pipeline_parallel_size > 1:
        raise ConfigError(
            f"tensor_parallel_size {cfg.tensor_parallel_size} x pipeline_parallel_size {cfg.pipeline_parallel_size}: "
            "the torch engine runs on one device; set both to 1, or build with --backend trtllm to split across GPUs"
        )
    if cfg.resolved_kv_cache_dtype == "fp8":
        import torch

        if not hasattr(torch, "float8_e4m3fn"):
            raise MissingDependencyError(
                f"kv_cache_dtype fp8 needs torch.float8_e4m3fn; torch {torch.__version__} has none",
                hint="upgrade torch (>= 2.1) or set kv_cache_dtype: auto",
            )
    return _cpu_dtype_warnings(cfg.dtype)


def _cpu_dtype_warnings(dtype: str) -> list[str]:
    """The torch engine runs where it is built far more often than not: say when its dtype will be slow here."""
    import torch

    if torch.cuda.is_available() or dtype == "float32":
        return []
    if dtype == "bfloat16" and not bf16_is_fast():
        return ["dtype bfloat16: the compiled kernels do not run here and this CPU has no AMX or AVX512-BF16, so "
                "bf16 matmuls are emulated and run far slower than float32; build with dtype: float32 (or auto) to "
                "run here"]
    if dtype == "float16":
        return ["dtype float16 on CPU has no fast kernels in the torch engine; use bfloat16 (CPUs with AMX or "
                "AVX512-BF16) or float32"]
    return []


def _check_output(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise InputError(f"output '{out}' exists and is not a directory")
    if not overwrite:
        raise InputError(f"engine dir '{out}' already exists; remove it or allow overwriting")
    # Replacing deletes the old dir, so only ever replace an engine (or an empty dir).
    if not (out / MANIFEST_NAME).is_file() and any(out.iterdir()):
        raise InputError(f"refusing to replace '{out}': it is not empty and has no {MANIFEST_NAME}")


def _write_engine(cfg: EagleConfig, plan: CheckpointPlan, root: Path, max_shard_bytes: int) -> Manifest:
    trt = cfg.backend == "trtllm"
    for sub in ("target", "draft", "tokenizer"):
        (root / sub).mkdir()
    scales = _load(plan.kv_scales) if plan.kv_scales is not None else None
    fp8_scales = {}  # TensorRT-LLM reads FP8 KV scales from the target itself, the modelopt way
    if trt and plan.head_kind == "eagle3" and scales is not None and cfg.resolved_kv_cache_dtype == "fp8":
        fp8_scales = trtllm_bundle.kv_scale_tensors(scales, plan.target_info["num_layers"])
        _write_json(root / "target" / "hf_quant_config.json", trtllm_bundle.HF_QUANT_CONFIG)
    blocks = copy_weights(plan.target_weights, root / "target", cfg.dtype, max_shard_bytes, keep=fp8_scales,
                          weights=cfg.resolved_weights, tied=bool(plan.target_config.get("tie_word_embeddings")))
    _write_json(root / "target" / "config.json", _with_dtype(plan.target_config, cfg.dtype, trt))
    for src in plan.target_extra_files:
        shutil.copyfile(src, root / "target" / src.name)

    # Tensor names stay as in the checkpoint: the runtime tells official (midlayer.*) heads from
    # modelopt (layers.0.*) ones by name, and they normalise the hidden input differently. A trtllm
    # bundle takes TensorRT-LLM's names instead (its EAGLE-3 draft calls the decoder layer midlayer).
    draft_tensors = _draft_tensors(plan, trt)
    from eagle_trt.engine import weight_blocks

    draft_tensors, draft_blocks = weight_blocks.quantize_dict(
        draft_tensors, cfg.resolved_draft_weights, tied=bool(plan.engine_draft_config.get("tie_word_embeddings")),
        kept_dir=plan.draft_weights.parent)
    save_weights(draft_tensors, root / "draft" / "model.safetensors", cfg.dtype)
    if draft_blocks:
        from eagle_trt.models.block_weights import write_table

        write_table(root / "draft", draft_blocks)
    _write_json(root / "draft" / "config.json", _with_dtype(plan.engine_draft_config, cfg.dtype, trt))
    for src in plan.tokenizer_files:
        shutil.copyfile(src, root / "tokenizer" / src.name)
        if trt:  # TensorRT-LLM and trtllm-bench expect a complete HF model dir
            shutil.copyfile(src, root / "target" / src.name)
    if plan.kv_scales is not None:
        shutil.copyfile(plan.kv_scales, root / KV_SCALES_NAME)
    if plan.datastore is not None and not trt:  # TensorRT-LLM drafts with the head alone
        write_indexed(plan.datastore, root / "draft" / plan.datastore.name, plan.target_info["vocab_size"])
    # The engine dir is the deployable artifact: no path of the build machine (the checkpoint's) goes in it.
    (root / "eagle_config.yaml").write_text(dump_config(cfg.model_copy(update={"checkpoint_dir": None})),
                                            encoding="utf-8")
    if trt:
        trtllm_bundle.write_bundle(cfg, plan.head_kind, plan.draft_info["aux_layer_ids"], plan.target_config,
                                   plan.engine_draft_config, root)  # fmt: skip

    manifest = Manifest(
        format_version=FORMAT_VERSION,
        name=cfg.name,
        backend=cfg.backend,
        created_by=library_versions(),
        dtype=cfg.dtype,
        weights=_weights_summary(blocks),
        draft_weights=_weights_summary(draft_blocks),
        block_compute=_block_compute(cfg, blocks or draft_blocks),
        kv_cache_dtype=cfg.resolved_kv_cache_dtype,
        tree_limits=TreeLimits(**cfg.model_dump(include=set(TreeLimits.model_fields))),
        io_limits=IoLimits(**cfg.model_dump(include=set(IoLimits.model_fields))),
        target=TargetInfo(**plan.target_info),
        draft=DraftInfo(**plan.draft_info),
        files=hash_files(root),
    )
    write_manifest(manifest, root)  # last: its presence marks the engine complete
    return manifest


def _draft_tensors(plan: CheckpointPlan, trt: bool) -> dict:
    """The draft's tensors under the names the engine stores; a draft model's checked finite here (a head's values
    were checked with its shapes, engine/head_checks.py)."""
    from eagle_trt.quant_blocks import check_finite

    tensors = _load(plan.draft_weights)
    if plan.head_kind == "model":
        for name, t in tensors.items():
            check_finite(t, None, name, plan.draft_weights)
    if trt and plan.head_kind == "eagle3":
        tensors = trtllm_bundle.draft_tensor_names(tensors, plan.architecture.num_hidden_layers)
    return tensors


def _weights_summary(table: dict) -> str:
    """The manifest's `weights`: float, or the block formats the engine's projections use (q8_0, q4_k+q6_k)."""
    from eagle_trt.models import block_weights

    return block_weights.summary(table) or "float"


def _block_compute(cfg: EagleConfig, any_blocks) -> str:
    """The manifest's `block_compute`: float where asked or where nothing is in blocks, else int8 (auto's choice:
    the faster on the CPU kernels, docs/bench.md)."""
    return "float" if cfg.block_compute == "float" or not any_blocks or cfg.backend != "torch" else "int8"


def _load(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _with_dtype(config: dict, dtype: str, both: bool = False) -> dict:
    out = dict(config)
    out["dtype"] = dtype  # transformers >= 4.56 reads "dtype"; older ones (TensorRT-LLM's) "torch_dtype"
    if both or "torch_dtype" in out:
        out["torch_dtype"] = dtype
    return out


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, sort_keys=True, indent=2) + "\n", encoding="utf-8")
