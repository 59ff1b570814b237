"""manifest.json: what an engine dir holds, how it was built, and a sha256 + size for every file.

The manifest is written last during a build, so an engine dir without one is incomplete; the
hashes let `open_engine` catch truncated, tampered or half-copied engines before running them.

    >>> from pathlib import Path; import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "a.txt").write_text("hi")
    >>> hash_files(d)["a.txt"].bytes
    2
    >>> sha256_file(d / "a.txt")[:12]
    '8f434346648f'
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path, PurePosixPath
from typing import Literal

import safetensors
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

import eagle_trt
from eagle_trt.errors import EngineIntegrityError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
_CHUNK = 1 << 20  # hash in 1 MiB pieces so multi-GB weight files never sit in memory

_STRICT = ConfigDict(extra="forbid", frozen=True)


class FileEntry(BaseModel):
    model_config = _STRICT
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of the file's bytes.")
    bytes: int = Field(ge=0, description="File size in bytes.")


class CreatedBy(BaseModel):
    model_config = _STRICT
    eagle_trt: str = Field(description="eagle-trt version that built the engine.")
    torch: str = Field(description="torch version.")
    transformers: str = Field(description="transformers version.")
    safetensors: str = Field(description="safetensors version.")
    python: str = Field(description="Python version.")


class TreeLimits(BaseModel):
    model_config = _STRICT
    draft_length: int = Field(ge=1, description="Draft tree depth.")
    # Manifests written before the rename say max_beam_width (config/decode.py).
    beam_width: int = Field(ge=1, validation_alias=AliasChoices("beam_width", "max_beam_width"),
                            description="Top-k children per expansion.")
    total_tokens: int = Field(ge=1, description="Draft tokens in the tree, root excluded.")
    tree: Literal["dynamic", "static", "chain"] = Field(description="Tree shape.")
    confidence_threshold: float = Field(ge=0, lt=1, description="Branch pruning threshold.")
    static_tree: list[list[int]] | None = Field(description="Static tree paths (tree=static only).")


class IoLimits(BaseModel):
    model_config = _STRICT
    max_batch_size: int = Field(ge=1, description="Largest batch.")
    max_input_len: int = Field(ge=1, description="Longest prompt in tokens.")
    max_output_len: int = Field(ge=1, description="Most generated tokens per request.")


class TargetInfo(BaseModel):
    model_config = _STRICT
    architecture: str = Field(description="Target architectures[0], e.g. LlamaForCausalLM.")
    hidden_size: int = Field(gt=0, description="Target hidden size.")
    num_layers: int = Field(gt=0, description="Target decoder layers.")
    vocab_size: int = Field(gt=0, description="Target vocabulary size.")


class DraftInfo(BaseModel):
    model_config = _STRICT
    kind: Literal["eagle3", "eagle1", "model"] = Field(
        "eagle3", description="An EAGLE head (eagle3, or eagle1 for EAGLE-1/2) or a small language model (model).")
    hidden_size: int = Field(gt=0, description="Draft hidden size (= target hidden size for a head).")
    draft_vocab_size: int = Field(gt=0, description="Rows of the draft lm_head.")
    aux_layer_ids: list[int] = Field(description="Target layers whose outputs feed the draft fc (none for a model).")


class Manifest(BaseModel):
    model_config = _STRICT
    format_version: int = Field(description="Engine dir layout version.")
    name: str = Field(description="Engine name from the config.")
    backend: Literal["torch", "trtllm"] = Field(description="Runtime the engine was built for.")
    created_by: CreatedBy = Field(description="Library versions used for the build.")
    dtype: str = Field(description="Weight dtype.")
    weights: str = Field("float", description="How the target's projections and LM head are stored: float (in dtype), "
                         "or the GGUF block formats they use, most common first (q8_0, q4_k+q6_k).")
    draft_weights: str = Field("float", description="How the draft's projections (an EAGLE-3 head's or a draft "
                               "model's) are stored: float (in dtype) or their GGUF block formats.")
    block_compute: Literal["float", "int8"] = Field(
        "float", description="How the block weights compute on the CPU kernels: int8 (int8 activations, integer "
        "block dot products) or float (fp32 de-quantized rows); float for an engine built before the choice existed.")
    kv_cache_dtype: str = Field(description="KV-cache dtype (auto already resolved).")
    tree_limits: TreeLimits = Field(description="Speculation tree limits.")
    io_limits: IoLimits = Field(description="Request limits.")
    target: TargetInfo = Field(description="Target model summary.")
    draft: DraftInfo = Field(description="Draft head summary.")
    files: dict[str, FileEntry] = Field(description="Every file but manifest.json: relative path -> hash.")

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        # A crafted manifest must not make open_engine hash (or trust) files outside the engine.
        for rel in files:
            p = PurePosixPath(rel)
            if p.is_absolute() or ".." in p.parts or "\\" in rel or rel in ("", MANIFEST_NAME):
                raise ValueError(f"bad file path {rel!r}")
        return files


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_files(root: str | Path) -> dict[str, FileEntry]:
    """FileEntry for every regular file under root except manifest.json, keyed by posix path."""
    root = Path(root)
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MANIFEST_NAME:
            out[rel] = FileEntry(sha256=sha256_file(path), bytes=path.stat().st_size)
    return out


def library_versions() -> CreatedBy:
    """Versions recorded in created_by (imports are lazy: only builds need torch)."""
    # Imported here: torch and transformers take seconds to import; only builds record them, `inspect` must not wait.
    import torch
    import transformers

    return CreatedBy(
        eagle_trt=eagle_trt.__version__,
        torch=torch.__version__,
        transformers=transformers.__version__,
        safetensors=safetensors.__version__,
        python=platform.python_version(),
    )


def write_manifest(manifest: Manifest, root: str | Path) -> Path:
    """Write root/manifest.json with sorted keys (stable bytes for the same manifest)."""
    path = Path(root) / MANIFEST_NAME
    text = json.dumps(manifest.model_dump(mode="json"), sort_keys=True, indent=2) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def read_manifest(root: str | Path) -> Manifest:
    """Parse root/manifest.json; EngineIntegrityError (one line, naming the file) if it is unusable."""
    path = Path(root) / MANIFEST_NAME
    if not path.is_file():
        raise EngineIntegrityError(
            f"'{path}' not found: '{root}' is not an engine dir or its build did not finish",
            hint="rebuild it with `eagle-trt build`",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise EngineIntegrityError(f"'{path}' is not valid JSON: {exc}") from exc
    version = data.get("format_version") if isinstance(data, dict) else None
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise EngineIntegrityError(
            f"'{path}' has format_version {version}; this eagle-trt reads up to {FORMAT_VERSION}",
            hint="upgrade eagle-trt or rebuild the engine",
        )
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise EngineIntegrityError(f"'{path}' is not a valid manifest: {where}: {first['msg']}{more}") from exc
    if manifest.format_version != FORMAT_VERSION:
        raise EngineIntegrityError(f"'{path}' has unsupported format_version {manifest.format_version}")
    return manifest
