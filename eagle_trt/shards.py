"""The shard files a `model.safetensors.index.json` names, checked before any is opened.

The index is data from wherever the model came from: a shard name that is a path (`../x`, `/etc/x`, `a/b`) would
read a file outside the model dir, so every name must be a plain `*.safetensors` file name in that dir.

    shards = index_shards(Path("model/model.safetensors.index.json"))   # [model/model-00001-of-00002..., ...]
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath, PureWindowsPath

from eagle_trt.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"


def check_shard_name(name, index: Path) -> str:
    """`name` if it is a plain *.safetensors file name (no directory part), else a CheckpointError naming it."""
    ok = (isinstance(name, str) and name.endswith(".safetensors") and name not in (".", "..")
          and PurePosixPath(name).name == name and PureWindowsPath(name).name == name and "\0" not in name)
    if not ok:
        raise CheckpointError(f"'{index}' names the shard {name!r}, which is not a file name in its dir; shards "
                              "must be plain *.safetensors names next to the index", hint="re-download the model")
    return name


def index_weight_map(index: Path) -> dict[str, str]:
    """The index's weight_map (tensor name -> shard name), every shard name checked."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, RecursionError) as e:
        raise CheckpointError(f"unreadable '{index}' ({e})", hint="re-download the model") from None
    return {tensor: check_shard_name(name, index) for tensor, name in weight_map.items()}


def index_shards(index: Path) -> list[Path]:
    """The distinct shard files the index names, in name order, as paths next to it."""
    return [index.parent / name for name in sorted(set(index_weight_map(index).values()))]
