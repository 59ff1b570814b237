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
from eagle_trt.shards import INDEX_NAME, index_shards, index_weight_map

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
    """The tensors a safetensors file holds (header only), in file order. Every entry is checked against the file:
    a known dtype, a shape of non-negative ints, data offsets that fit the file and match the shape's size."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 << 20:
                raise ValueError(f"header of {n} bytes")
            raw = f.read(n)
            if len(raw) != n:
                raise ValueError("the file ends inside its header")
            header = json.loads(raw)
            size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError, struct.error, RecursionError) as e:
        raise CheckpointError(f"'{path}' is not a readable safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"'{path}' is not a readable safetensors file (its header is not a JSON object)")
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(path, name, info, base, size)
    return dict(sorted(out.items(), key=lambda kv: kv[1].start))


def _entry(path: Path, name: str, info, base: int, size: int) -> Entry:
    bad = f"'{path}': tensor {name!r}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{bad} has no dtype, shape and data_offsets (the header is damaged)")
    dtype = DTYPES.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
    if dtype is None:
        raise CheckpointError(f"{bad} has dtype {info.get('dtype')!r}, which is not supported")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise CheckpointError(f"{bad} has shape {shape!r}, not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                                    for o in offsets)
            and 0 <= offsets[0] <= offsets[1] and base + offsets[1] <= size):
        raise CheckpointError(f"{bad} has data_offsets {offsets!r}, which do not fit the file ({size} bytes): "
                              "truncated or damaged")
    count = 1
    for d in shape:
        count *= d
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if count * itemsize != offsets[1] - offsets[0]:
        raise CheckpointError(f"{bad}: {offsets[1] - offsets[0]} bytes in the file for shape {shape} of "
                              f"{info['dtype']}")
    return Entry(name, dtype, tuple(shape), base + offsets[0], base + offsets[1])


def tensor_locations(shards: list[Path], index: Path | None = None) -> dict[str, tuple[Path, Entry]]:
    """Every tensor in `shards` and where it lies (headers only). Refused, naming the files: a tensor held by two
    files (which copy a reader takes depends on the reader, so the model would silently differ between tools), and,
    given the index that names the shards, a tensor in another shard than the one it maps it to, or one it maps
    that no shard holds."""
    where: dict[str, tuple[Path, Entry]] = {}
    for shard in shards:
        for name, e in read_entries(shard).items():
            if name in where:
                raise CheckpointError(f"tensor {name!r} is in both '{where[name][0]}' and '{shard}': a tensor must be "
                                      "in one file only", hint="re-export the model")
            where[name] = (shard, e)
    if index is not None:
        mapped = index_weight_map(index)
        for name, (shard, _) in where.items():
            if name in mapped and mapped[name] != shard.name:
                raise CheckpointError(f"tensor {name!r} is in '{shard}', but '{index}' maps it to "
                                      f"'{index.parent / mapped[name]}'", hint="re-export the model")
        for name, shard_name in mapped.items():
            if name not in where:
                raise CheckpointError(f"'{index}' maps tensor {name!r} to '{index.parent / shard_name}', which does "
                                      "not hold it", hint="re-export the model")
    return dict(sorted(where.items(), key=lambda kv: (str(kv[1][0]), kv[1][1].start)))


def model_tensors(model_dir: Path) -> dict[str, tuple[Path, Entry]]:
    """`tensor_locations` of a model dir: its model.safetensors, else the shards its index names."""
    model_dir = Path(model_dir)
    single = model_dir / SINGLE_NAME
    if single.is_file():
        return tensor_locations([single])
    index = model_dir / INDEX_NAME
    if index.is_file():
        return tensor_locations(index_shards(index), index)
    raise CheckpointError(f"{single}: file not found")


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


MAX_SIZE = 1 << 60  # no file or cache is larger; a larger value is a typo


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
        value = int(float(number) * factor)  # inf and nan raise here (OverflowError, ValueError)
    except (ValueError, OverflowError):
        value = 0
    if value <= 0 or value > MAX_SIZE:
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
