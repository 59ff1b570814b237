"""The layout of a GGUF file: its scalar metadata and where each tensor's bytes lie, read from a map of the file.

    gf = GGUFFile.open("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    gf.metadata["general.architecture"]          # 'llama'; arrays (the vocabulary) are skipped, not decoded
    info = gf.tensors["blk.0.ffn_up.weight"]     # TensorInfo(name, dims=(576, 1536), ggml_type=3, offset=...)
    raw = gf.raw(info)                           # numpy uint8 view of its bytes (copy-on-write map, no read)

The format (ggml's docs/gguf.md, versions 2 and 3, little-endian): magic "GGUF", uint32 version, uint64 tensor and
key-value counts; each key-value as a string key, a uint32 type and the value (arrays: element type, uint64 count,
elements); each tensor as a string name, uint32 n_dims, uint64 dims (innermost first), uint32 ggml type and a
uint64 offset into the data section, which starts at the next multiple of `general.alignment` (32 if absent).
Strings are a uint64 length and UTF-8 bytes. This reader walks the header with `struct` over the map; gguf-py's
reader decodes every array element into its own numpy view, seconds for a 150k-token vocabulary.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eagle_trt.errors import CheckpointError

# GGUF value types -> struct format of one element (8 = string, 9 = array: variable length).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# ggml type id -> (name, weights per block, bytes per block), for every type ggml defines: the sizes are needed
# to find where a tensor ends even when its type is one eagle-trt refuses.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: innermost (in_features) first
    ggml_type: int
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]


class _Cursor:
    """Reads little-endian values from a buffer; any read past its end is a truncated file."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise CheckpointError(f"truncated GGUF file {self.path} (its header ends early); re-download it")
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise CheckpointError(f"truncated GGUF file {self.path} (a string runs past the end); re-download it")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"corrupt GGUF file {self.path} (a string is not UTF-8: {e}); re-download it") from e

    def value(self, vtype: int):
        """One value; an array is skipped (None), its elements walked only as far as needed to find its end."""
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise CheckpointError(f"corrupt GGUF file {self.path} (unknown value type {vtype}); re-download it")
        etype, count = self.take("I"), self.take("Q")
        if etype in _SCALARS:
            self.pos += count * struct.calcsize("<" + _SCALARS[etype])
        elif etype == _STRING:
            for _ in range(count):
                self.pos += 8 + self.take("Q")
        else:
            for _ in range(count):
                self.value(etype)
        if self.pos > len(self.buf):
            raise CheckpointError(f"truncated GGUF file {self.path} (an array runs past the end); re-download it")
        return None


def _tensor_info(cur: _Cursor, path: Path) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string()
    n_dims = cur.take("I")
    if not 1 <= n_dims <= 4:
        raise CheckpointError(f"corrupt GGUF file {path}: tensor {name} has {n_dims} dimensions; re-download it")
    dims = tuple(cur.take("Q") for _ in range(n_dims))
    ggml_type, offset = cur.take("I"), cur.take("Q")
    if ggml_type not in GGML_TYPES:
        raise CheckpointError(f"{path}: tensor {name} has ggml type id {ggml_type}, which eagle-trt does not know; "
                              "use a GGUF quantized to a common type (Q4_K, Q6_K, Q8_0, ...)")
    return name, dims, ggml_type, offset


def _check_disjoint(path: Path, tensors: dict[str, TensorInfo]) -> None:
    """No two tensors share a byte: each ends before the next one (by offset) begins."""
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (_, end, name), (begin, _, after) in zip(spans, spans[1:]):
        if begin < end:
            raise CheckpointError(f"corrupt GGUF file {path}: tensors {name} and {after} overlap (bytes {begin}-{end} "
                                  "of the file); re-download it")


@dataclass
class GGUFFile:
    path: Path
    metadata: dict  # scalar and string values by key; arrays are present with the value None
    tensors: dict[str, TensorInfo]
    _map: np.ndarray

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        path = Path(path)
        try:
            # Copy-on-write: views are writable (torch wraps them without a copy); the file itself is never written.
            mapped = np.memmap(path, dtype=np.uint8, mode="c")
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot map GGUF file {path} ({e}); check the path") from e
        cur = _Cursor(memoryview(mapped), path)
        if bytes(mapped[:4]) != b"GGUF":
            raise CheckpointError(f"{path} is not a GGUF file (no GGUF magic); pass a .gguf model")
        cur.pos = 4
        version = cur.take("I")
        if version not in (2, 3):
            raise CheckpointError(f"{path} is GGUF version {version}; eagle-trt reads versions 2 and 3 "
                                  "(a big-endian file also shows up here); re-convert it with a current llama.cpp")
        n_tensors, n_kv = cur.take("Q"), cur.take("Q")
        metadata = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.take("I"))
        infos = [_tensor_info(cur, path) for _ in range(n_tensors)]
        align = metadata.get("general.alignment", 32)
        # ggml pads with GGML_PAD, which needs a power of two (bool is an int: refused too)
        if type(align) is not int or align <= 0 or align & (align - 1):
            raise CheckpointError(f"corrupt GGUF file {path}: general.alignment is {align!r}, not a power of two; "
                                  "re-download it")
        start = -(-cur.pos // align) * align
        tensors = {}
        for name, dims, ggml_type, offset in infos:
            _, n, b = GGML_TYPES[ggml_type]
            elements = math.prod(dims)  # Python ints: a corrupt dimension cannot overflow into a small size
            info = TensorInfo(name, dims, ggml_type, start + offset, elements // n * b)
            if dims[0] % n or info.offset + info.nbytes > len(mapped):
                raise CheckpointError(f"corrupt or truncated GGUF file {path}: tensor {name} ({info.type_name} "
                                      f"{list(dims)}) does not fit the file; re-download it")
            if offset % align:
                raise CheckpointError(f"corrupt GGUF file {path}: tensor {name} starts at data offset {offset}, not "
                                      f"a multiple of general.alignment {align}; re-download it")
            if name in tensors:
                raise CheckpointError(f"corrupt GGUF file {path}: tensor {name} appears twice; re-download it")
            tensors[name] = info
        _check_disjoint(path, tensors)
        return cls(path, metadata, tensors, mapped)

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes: a uint8 view of the map (nothing is read until used)."""
        return self._map[info.offset:info.offset + info.nbytes]
