"""Safetensors files read and written one tensor at a time, so converting or building a model never holds it whole.

    entries = read_entries(path)                       # names, dtypes, shapes, byte ranges: the header only
    with open(path, "rb") as f:
        w = read_tensor(f, entries["model.norm.weight"])
    write_sharded(out_dir, plan, produce, max_shard_bytes)   # model.safetensors, or shards + index

Reads use plain file reads into a fresh tensor (no memory map: mapped pages of a multi-GB file would all count as
resident by the end). Writes lay out a header from the plan, then each tensor as `produce(name)` returns it; the
file is the same format `safetensors.torch.save_file` writes (little-endian, offsets relative to the data section,
header padded to 8 bytes), which any safetensors reader opens.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from eagle_trt.errors import CheckpointError
from eagle_trt.shards import INDEX_NAME

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_entries(path: str | Path) -> dict[str, Entry]:
    """The tensors a safetensors file holds (header only), in file order."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 << 20:
                raise ValueError(f"header of {n} bytes")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise CheckpointError(f"'{path}' is not a readable safetensors file ({e})") from None
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"'{path}': tensor {name!r} has dtype {info.get('dtype')!r}, which is not supported")
        begin, end = info["data_offsets"]
        out[name] = Entry(name, dtype, tuple(info["shape"]), base + begin, base + end)
    return dict(sorted(out.items(), key=lambda kv: kv[1].start))


def read_tensor(f, entry: Entry) -> torch.Tensor:
    """The tensor `entry` names, read from the open file `f` into new memory."""
    out = torch.empty(entry.shape, dtype=entry.dtype)
    raw = out.view(-1).view(torch.uint8) if out.numel() else out.view(torch.uint8)
    if raw.numel() != entry.nbytes:
        raise CheckpointError(f"tensor {entry.name!r}: {entry.nbytes} bytes in the file for shape {list(entry.shape)}")
    f.seek(entry.start)
    if entry.nbytes and f.readinto(raw.numpy()) != entry.nbytes:
        raise CheckpointError(f"tensor {entry.name!r} is cut short: the file is truncated")
    return out


@dataclass(frozen=True)
class Planned:
    """A tensor to write: its name, dtype and shape, known before its data is."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty(0, dtype=self.dtype).element_size()


def parse_size(text: str | int) -> int:
    """'5GB', '500MB', '2GiB', '100000' -> bytes (decimal units as transformers reads them, binary with 'i')."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper()
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9, "B": 1}
    for unit, factor in units.items():
        if s.endswith(unit):
            number = s[: -len(unit)].strip()
            break
    else:
        number, factor = s, 1
    try:
        value = int(float(number) * factor)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"not a size: {text!r} (give e.g. 5GB, 500MB or a number of bytes)")
    return value


def plan_shards(plan: list[Planned], max_shard_bytes: int) -> list[list[Planned]]:
    """Consecutive groups of at most max_shard_bytes (a tensor larger than that gets a shard of its own)."""
    shards: list[list[Planned]] = [[]]
    size = 0
    for p in plan:
        if shards[-1] and size + p.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    return shards


def write_sharded(out_dir: Path, plan: list[Planned], produce: Callable[[str], torch.Tensor], max_shard_bytes: int,
                  metadata: dict | None = None, prefix: str = "model") -> list[Path]:
    """Write the planned tensors under out_dir: one `model.safetensors` when they fit max_shard_bytes, else
    `model-0000i-of-0000N.safetensors` plus `model.safetensors.index.json`, as transformers names them. Each
    tensor comes from produce(name), one at a time, and must have its planned dtype and shape. Files are 0644."""
    groups = plan_shards(plan, max_shard_bytes)
    names = ([f"{prefix}.safetensors"] if len(groups) == 1 else
             [f"{prefix}-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)])
    paths = []
    for name, group in zip(names, groups):
        paths.append(_write_file(out_dir / name, group, produce, metadata))
    if len(groups) > 1:
        index = {"metadata": {"total_size": sum(p.nbytes for p in plan)},
                 "weight_map": {p.name: name for name, group in zip(names, groups) for p in group}}
        index_path = out_dir / (INDEX_NAME if prefix == "model" else f"{prefix}.safetensors.index.json")
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        index_path.chmod(0o644)
    return paths


def _write_file(path: Path, group: list[Planned], produce, metadata: dict | None) -> Path:
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for p in group:
        header[p.name] = {"dtype": NAMES[p.dtype], "shape": list(p.shape), "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for p in group:
            t = produce(p.name)
            if t.dtype != p.dtype or tuple(t.shape) != p.shape:
                raise RuntimeError(f"{p.name}: produced {t.dtype} {list(t.shape)}, planned {p.dtype} {list(p.shape)}")
            t = t.contiguous()
            if t.numel():
                f.write(t.view(-1).view(torch.uint8).numpy().data)
        f.flush()
        os.fsync(f.fileno())
    path.chmod(0o644)
    return path
