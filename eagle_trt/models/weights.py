"""Safe weight loading: safetensors only (never pickle), with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle_trt.errors import CheckpointError
from eagle_trt.safetensors_stream import model_tensors, read_tensor, tensor_locations
from eagle_trt.shards import INDEX_NAME, index_shards


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def load_safetensors(path: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """All tensors of one file, or of every shard its dir's model.safetensors.index.json names when `path` is a
    missing model.safetensors beside such an index; floating tensors cast to `dtype` when given."""
    path = Path(path)
    if not path.is_file() and (path.parent / INDEX_NAME).is_file():
        index = path.parent / INDEX_NAME
        shards = index_shards(index)
        tensor_locations(shards, index)  # no tensor in two shards, each where the index says
        out: dict[str, torch.Tensor] = {}
        for shard in shards:
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


class LazyTensors:
    """A model dir's tensors (model.safetensors, or the shards its index names) read one at a time as they are
    taken, cast to `dtype` when floating: loading a model this way never holds its checkpoint layout whole beside
    what is made of it. Supports what loading uses: `in`, `pop` (with `take`) and iteration over the names."""

    def __init__(self, model_dir: Path, dtype: torch.dtype | None = None):
        self.dtype = dtype
        self._where = model_tensors(Path(model_dir))
        self._files: dict = {}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __iter__(self):
        return iter(list(self._where))

    def keys(self):
        return list(self._where)

    def pop(self, name: str, *default):
        if name not in self._where:
            if default:
                return default[0]
            raise KeyError(name)
        shard, entry = self._where.pop(name)
        if shard not in self._files:
            self._files[shard] = open(shard, "rb")
        t = read_tensor(self._files[shard], entry)
        if not self._where:
            self.close()
        return t.to(self.dtype) if self.dtype is not None and t.is_floating_point() else t

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
