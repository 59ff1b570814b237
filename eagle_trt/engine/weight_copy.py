"""Checkpoint weights into an engine dir: cast to the engine dtype (floating tensors only: d2t offsets and t2d masks
stay exact integers and bools), some kept or made into GGUF blocks, each checked finite as it is read once.

    table = copy_weights(shards, out_dir, "bfloat16", 2 << 30, weights="auto")   # blocks.json's table
    save_weights(tensors, out_dir / "model.safetensors", "bfloat16")             # a small dict, in one file
"""

from __future__ import annotations

from pathlib import Path

WEIGHT_METADATA = {"format": "pt"}


def copy_weights(shards: list[Path], out_dir: Path, dtype: str, max_shard_bytes: int, keep: dict | None = None,
                 weights: str = "float", tied: bool = False) -> dict:
    """The checkpoint's weights into out_dir in the engine dtype, one tensor in memory at a time, sharded at
    max_shard_bytes; `keep` tensors are added as they are (FP8 scales stay float32). Only floating tensors change
    dtype: d2t offsets and t2d masks must stay exact integers and bools. `weights` (the config's): which tensors
    become GGUF blocks (`engine/weight_blocks.py`), listed in out_dir's blocks.json; returns that table."""
    import torch

    from eagle_trt.engine import weight_blocks
    from eagle_trt.models import block_weights
    from eagle_trt.quant_blocks import check_finite
    from eagle_trt.safetensors_stream import Planned, read_tensor, tensor_locations, write_sharded
    from eagle_trt.shards import INDEX_NAME

    cast = getattr(torch, dtype)
    index = shards[0].parent / INDEX_NAME if shards and shards[0].name != "model.safetensors" else None
    source = tensor_locations(shards, index)
    kept = block_weights.read_table(shards[0].parent, block_weights.KEPT_TABLE) if shards else {}
    if kept:  # a GGUF's own blocks, beside the float weights (convert/keep_blocks.py)
        kept_source = tensor_locations([shards[0].parent / block_weights.KEPT_FILE], None)
    blocks = weight_blocks.plan({n: tuple(e.shape) for n, (_, e) in source.items()}, weights, kept, tied)
    keep = keep or {}
    plan = [Planned(name, cast if e.dtype.is_floating_point else e.dtype, e.shape)
            for name, (_, e) in source.items() if name not in blocks]
    plan += [Planned(name, torch.uint8, p.stored_shape) for name, p in blocks.items()]
    plan += [Planned(name, t.dtype, tuple(t.shape)) for name, t in keep.items()]
    plan.sort(key=lambda p: p.name)
    files: dict[Path, object] = {}

    def read(name: str, from_kept: bool = False):
        shard, entry = (kept_source if from_kept else source)[name]
        if shard not in files:
            files[shard] = open(shard, "rb")
        t = read_tensor(files[shard], entry)
        check_finite(t, kept[name]["format"] if from_kept else None, name, shard)  # each weight read once, here
        return t

    def produce(name: str):
        if name in keep:
            return keep[name]
        if name in blocks:
            return weight_blocks.produce(blocks[name], read)
        t = read(name)
        return t.to(cast) if t.is_floating_point() else t

    try:
        write_sharded(out_dir, plan, produce, max_shard_bytes, metadata=WEIGHT_METADATA)
    finally:
        for f in files.values():
            f.close()
    table = weight_blocks.table(blocks)
    if table:
        block_weights.write_table(out_dir, table)
    return table


def save_weights(tensors: dict, path: Path, dtype: str, keep: dict | None = None) -> None:
    """Write tensors cast to dtype, plus `keep` tensors as they are (FP8 scales stay float32)."""
    import torch
    from safetensors.torch import save_file

    target = getattr(torch, dtype)
    # Only floating tensors change dtype: d2t offsets and t2d masks must stay exact integers/bools.
    cast = {k: (t.to(target) if t.is_floating_point() else t).contiguous() for k, t in tensors.items()}
    cast.update({k: t.contiguous() for k, t in (keep or {}).items()})
    save_file(dict(sorted(cast.items())), str(path), metadata=WEIGHT_METADATA)
    path.chmod(0o644)  # safetensors >= 0.7 writes 0600 temp files; an engine is shared, read-only data
