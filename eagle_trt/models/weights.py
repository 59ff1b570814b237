"""Safe weight loading: safetensors only (never pickle), with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle_trt.errors import CheckpointError


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def load_safetensors(path: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """All tensors of one file, or of every shard its dir's model.safetensors.index.json names when `path` is a
    missing model.safetensors beside such an index; floating tensors cast to `dtype` when given."""
    from safetensors.torch import load_file

    from eagle_trt.shards import INDEX_NAME, index_shards

    path = Path(path)
    if not path.is_file() and (path.parent / INDEX_NAME).is_file():
        out: dict[str, torch.Tensor] = {}
        for shard in index_shards(path.parent / INDEX_NAME):
            out.update(load_safetensors(shard, dtype))
        return out
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for bad headers/sizes
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None
    if dtype is not None:
        tensors = {k: (t.to(dtype) if t.is_floating_point() else t) for k, t in tensors.items()}
    return tensors


def take(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], source: Path | str) -> torch.Tensor:
    """Pop `name` and check its shape, or raise a CheckpointError naming both."""
    if name not in tensors:
        raise CheckpointError(f"{source}: tensor '{name}' is missing")
    t = tensors.pop(name)
    if tuple(t.shape) != tuple(shape):
        raise CheckpointError(
            f"{source}: tensor '{name}' has shape {list(t.shape)}, expected {list(shape)} for this target"
        )
    return t
