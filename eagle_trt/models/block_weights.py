"""Projection weights kept as GGUF's quantized blocks: what a quantized engine stores and its kernels read.

A `BlockWeight` is a projection's [out, in] weight as rows of GGUF blocks (ggml-common.h's byte layout: q8_0, q4_0,
q4_1, q4_K, q5_K, q6_K, or plain f32/f16/bf16 rows), in segments of output rows that each have one format: a fused
projection (q, k, v) whose parts a GGUF stores in different formats is several segments. The same bytes serve every
kernel: the compiled block kernel (`native/block_gemm.py`, `csrc/gemm_blocks.cpp`) and the torch reference
(`BlockReference`, which de-quantizes once at load: `quant_blocks.dequantize`, gguf-py's values bit for bit).

An engine stores each block weight as a uint8 safetensors tensor [out, bytes per row] under its HF name, and
`blocks.json` beside the weights names each one's format and logical shape (`write_table`, `read_table`).

    w = quantize(torch.randn(64, 256), "q4_k")      # build: from a float checkpoint (llama.cpp's reference quantizers)
    fused = projection_weight([q, k, v])            # the kernels' input for q, k and v as one projection
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_trt import quant_blocks, quant_encode
from eagle_trt.errors import CheckpointError

TABLE_NAME = "blocks.json"
TABLE_FORMAT = "eagle-trt-blocks/1"
# A checkpoint converted from a GGUF keeps the file's blocks apart from its float weights (`convert/keep_blocks.py`).
KEPT_FILE, KEPT_TABLE = "gguf_blocks.safetensors", "gguf_blocks.json"
# Format name -> ggml type id (the number a GGUF file stores; the compiled kernels take the same ids).
FORMATS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_k": 12, "q5_k": 13,
           "q6_k": 14, "bf16": 30}
# What `build` makes from a float checkpoint (`quant_encode.quantize_rows`: llama.cpp's reference quantizers, byte for
# byte). q5_k and q6_k come only from a GGUF, whose blocks convert keeps.
QUANTIZABLE = ("q8_0", "q4_k", "q4_0", "q4_1", "q5_0", "q5_1")
# The HF names of a Llama-family model's projection weights (and the LM head): what a quantized engine keeps in
# blocks. Embeddings and norms stay in the engine's float dtype.
PROJECTION_SUFFIXES = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                       "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                       "mlp.down_proj.weight")


def _block(fmt: str) -> tuple[int, int]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown block format {fmt!r}; known: {', '.join(FORMATS)}")
    return quant_blocks.BLOCKS[fmt]


def block_elems(fmt: str) -> int:
    """Weights per block of a format (1 for the plain float rows)."""
    return _block(fmt)[0]


def row_bytes(fmt: str, in_features: int) -> int:
    """Bytes of one row of `in_features` weights; ValueError when that is not a whole number of blocks."""
    elems, size = _block(fmt)
    if in_features <= 0 or in_features % elems:
        raise ValueError(f"{fmt} rows take a multiple of {elems} weights, not {in_features}")
    return in_features // elems * size


@dataclass(frozen=True)
class Segment:
    """Output rows of one format: data uint8 [rows, bytes per row], each row its GGUF blocks."""

    format: str
    data: torch.Tensor

    @property
    def rows(self) -> int:
        return self.data.shape[0]


@dataclass(frozen=True)
class BlockWeight:
    """A projection weight [out, in] in GGUF blocks (see the module docstring)."""

    segments: tuple[Segment, ...]
    in_features: int

    def __post_init__(self):
        for s in self.segments:
            if s.data.dtype is not torch.uint8 or s.data.dim() != 2 or s.data.shape[1] != row_bytes(
                    s.format, self.in_features):
                raise ValueError(f"a {s.format} segment of {self.in_features} inputs takes uint8 [rows, "
                                 f"{row_bytes(s.format, self.in_features)}], got {s.data.dtype} {list(s.data.shape)}")

    @property
    def out_features(self) -> int:
        return sum(s.rows for s in self.segments)

    @property
    def shape(self) -> tuple[int, int]:
        """The logical [out, in] shape (what `weights.take` checks)."""
        return (self.out_features, self.in_features)

    @property
    def formats(self) -> list[str]:
        return [s.format for s in self.segments]

    @property
    def nbytes(self) -> int:
        return sum(s.data.numel() for s in self.segments)


def from_rows(fmt: str, data: torch.Tensor, in_features: int) -> BlockWeight:
    """A one-format weight from its rows of blocks (uint8 [out, bytes per row])."""
    return BlockWeight((Segment(fmt, data.contiguous()),), in_features)


def quantize(w: torch.Tensor, fmt: str) -> BlockWeight:
    """A float weight [out, in] quantized row by row to `fmt` (one of QUANTIZABLE), as llama.cpp quantizes."""
    if fmt not in QUANTIZABLE:
        raise ValueError(f"build quantizes to {', '.join(QUANTIZABLE)}, not {fmt!r}")
    return from_rows(fmt, quant_encode.quantize_rows(w.detach().float(), fmt).data, w.shape[1])


def dequantize(w: BlockWeight) -> torch.Tensor:
    """The fp32 [out, in] weight the blocks stand for: gguf-py's (the GGUF reference's) values bit for bit."""
    parts = [quant_blocks.dequantize(quant_blocks.QuantTensor(s.format, (s.rows, w.in_features), s.data))
             for s in w.segments]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def stack_rows(parts: list[BlockWeight]) -> BlockWeight:
    """One weight whose output rows are the parts' rows in order (q, k, v -> qkv): adjacent segments of one format
    merge."""
    k = parts[0].in_features
    if any(p.in_features != k for p in parts):
        raise ValueError("stacked block weights must share their input size")
    segs: list[Segment] = []
    for s in (s for p in parts for s in p.segments):
        if segs and segs[-1].format == s.format:
            segs[-1] = Segment(s.format, torch.cat([segs[-1].data, s.data]))
        else:
            segs.append(s)
    return BlockWeight(tuple(segs), k)


def projection_weight(parts: list) -> torch.Tensor | BlockWeight:
    """What the kernels' `projection` takes for one projection whose output rows are these HF weights' rows in
    order: float weights concatenated and transposed to [in, out]; block weights stacked (their rows stay rows)."""
    if all(isinstance(p, BlockWeight) for p in parts):
        return stack_rows(parts) if len(parts) > 1 else parts[0]
    if any(isinstance(p, BlockWeight) for p in parts):
        raise CheckpointError("a fused projection mixes block and float weights; rebuild the engine")
    return (torch.cat(parts) if len(parts) > 1 else parts[0]).t().contiguous()


class BlockReference:
    """The torch reference's projection over a block weight: de-quantized once (gguf-py) to fp32 [in, out]; each
    row of a call is its own one-row product, the shape a decode step has, so a verify row is bit-identical to
    decoding it alone; the result is rounded once to the activations' dtype."""

    __slots__ = ("w", "blocks")

    def __init__(self, blocks: BlockWeight):
        self.blocks = blocks
        self.w = dequantize(blocks).t().contiguous()

    @classmethod
    def from_dequantized(cls, w: torch.Tensor) -> "BlockReference":
        """The reference over a weight already de-quantized ([in, out] fp32, from the runtime weight cache)."""
        self = cls.__new__(cls)
        self.blocks, self.w = None, w
        return self

    @property
    def in_features(self) -> int:
        return self.w.shape[0]

    @property
    def out_features(self) -> int:
        return self.w.shape[1]

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        rows = [x[i:i + 1].float() @ self.w for i in range(x.shape[0])]
        y = torch.cat(rows) if rows else x.new_empty(0, self.out_features, dtype=torch.float32)
        return y.to(x.dtype)

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).argmax(dim=-1)


# ---- the engine's table of block tensors ------------------------------------------------------------------------
def write_table(model_dir: Path, table: dict[str, dict], name: str = TABLE_NAME) -> None:
    """blocks.json: {name: {"format", "shape": [out, in]}} for every tensor stored as blocks."""
    body = {"format": TABLE_FORMAT, "tensors": dict(sorted(table.items()))}
    (Path(model_dir) / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_table(model_dir: Path, name: str = TABLE_NAME) -> dict[str, dict]:
    """The block tensors of a model dir ({} when it keeps float weights only), checked."""
    path = Path(model_dir) / name
    if not path.is_file():
        return {}
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(body, dict) or body.get("format") != TABLE_FORMAT or not isinstance(body.get("tensors"), dict):
        raise CheckpointError(f"{path}: not a {TABLE_FORMAT} table; rebuild the engine")
    for name, e in body["tensors"].items():
        ok = isinstance(e, dict) and e.get("format") in FORMATS and isinstance(e.get("shape"), list) and len(
            e["shape"]) == 2 and all(isinstance(d, int) and d > 0 for d in e["shape"])
        if not ok:
            raise CheckpointError(f"{path}: entry {name!r} needs a known format and a 2-D shape, got {e!r}")
    return body["tensors"]


def summary(table: dict[str, dict]) -> str | None:
    """The formats of a table's tensors, most common first ("q8_0", or "q4_k+q6_k"), or None for an empty one."""
    counts: dict[str, int] = {}
    for e in table.values():
        counts[e["format"]] = counts.get(e["format"], 0) + 1
    return "+".join(sorted(counts, key=lambda f: (-counts[f], f))) or None


class BlockTensors:
    """A model dir's tensors (`weights.LazyTensors` or a dict) with the tensors `table` names taken as BlockWeights
    (their uint8 rows checked against the logical shape)."""

    def __init__(self, tensors, table: dict[str, dict], source):
        self._t, self._table, self._source = tensors, table, source

    def __contains__(self, name: str) -> bool:
        return name in self._t

    def __iter__(self):
        return iter(self._t)

    def __len__(self) -> int:
        return len(list(self._t))

    def keys(self):
        return list(self._t)

    def values(self):
        return self._t.values()

    def pop(self, name: str, *default):
        t = self._t.pop(name, *default)
        e = self._table.get(name)
        if e is None or not isinstance(t, torch.Tensor):
            return t
        out, k = e["shape"]
        try:
            need = row_bytes(e["format"], k)
        except ValueError as err:
            raise CheckpointError(f"{self._source}: tensor '{name}': {err}") from None
        if t.dtype is not torch.uint8 or tuple(t.shape) != (out, need):
            raise CheckpointError(f"{self._source}: tensor '{name}' is {t.dtype} {list(t.shape)}; its {e['format']} "
                                  f"blocks for [{out}, {k}] are uint8 [{out}, {need}]")
        return from_rows(e["format"], t, k)
