"""A head dir's weights stored as q8_0 blocks: half the bytes of fp16, for shipping a head whose target is wide.

`scripts/export_head.py --q8-0` writes each 2-D floating tensor whose rows are whole 32-weight blocks as its GGUF
q8_0 rows (uint8 [rows, bytes per row], `quant_encode.quantize_rows`: gguf-py's quantizer) and names them, with their
shapes, in the safetensors metadata under `Q8_KEY`; every other tensor stays as it was. `read_head_dir` turns them
back into fp32 (gguf-py's de-quantization, exact), so the rest of the import sees an ordinary head. Quantizing those
values to q8_0 again (`build` with `draft_weights: q8_0`) gives the same blocks: each block's largest weight is its
scale times 127, so the scale, and then every code, come out as they were.

    tensors, meta = pack_q8_0(tensors)         # what export_head.py saves, with metadata=meta
    tensors = unpack_q8_0(tensors, metadata)   # what read_head_dir does with a file's metadata
"""

from __future__ import annotations

import json

import torch

from eagle_trt.errors import CheckpointError
from eagle_trt.quant_blocks import QuantTensor, dequantize
from eagle_trt.quant_encode import quantize_rows

Q8_KEY = "eagle_trt.q8_0"  # metadata: {tensor name: [rows, cols]} of the tensors stored as q8_0 rows
BLOCK = 32


def pack_q8_0(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors with every 2-D floating weight of whole 32-blocks as q8_0 rows, the metadata naming them)."""
    out, shapes = {}, {}
    for name, t in tensors.items():
        if t.is_floating_point() and t.dim() == 2 and t.shape[1] % BLOCK == 0:
            out[name] = quantize_rows(t, "q8_0").data
            shapes[name] = list(t.shape)
        else:
            out[name] = t
    return out, {"format": "pt", Q8_KEY: json.dumps(shapes, sort_keys=True)}


def unpack_q8_0(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None, source: str = "head"
                ) -> dict[str, torch.Tensor]:
    """The tensors with those the metadata names as q8_0 rows de-quantized to fp32 (the rest as they are)."""
    if not metadata or Q8_KEY not in metadata:
        return tensors
    try:
        shapes = json.loads(metadata[Q8_KEY])
        if not isinstance(shapes, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise CheckpointError(f"{source}: metadata {Q8_KEY} is not a JSON object of shapes ({e})") from None
    out = dict(tensors)
    for name, shape in shapes.items():
        if name not in out:
            raise CheckpointError(f"{source}: metadata {Q8_KEY} names tensor '{name}', which the file lacks")
        if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(n, int) and n > 0 for n in shape)):
            raise CheckpointError(f"{source}: metadata {Q8_KEY} gives '{name}' the shape {shape!r}, not [rows, cols]")
        out[name] = dequantize(QuantTensor("q8_0", tuple(shape), out[name]))  # checks the rows' bytes
    return out
