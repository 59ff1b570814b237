"""What `convert` checks of a GGUF's contents before transformers loads it: a layer count its tensors bear out, and
block scales (and float weights) that are finite.

    check_gguf_contents(GGUFFile.open("models/SmolLM2-135M-Instruct.Q4_1.gguf"))   # None, or a CheckpointError

The header's own consistency (extents, alignment, no overlap) is `gguf_file.py`'s. Both run before the slow load:
transformers builds one name map per module over `block_count` blocks (quadratic in it), fills the layers a file
lacks with random weights without failing, and de-quantizes a NaN scale into NaN weights without a word.
"""

from __future__ import annotations

import re

import torch

from eagle_trt.convert.gguf_blocks import GGML_FORMATS
from eagle_trt.convert.gguf_file import GGUFFile
from eagle_trt.errors import CheckpointError
from eagle_trt.quant_blocks import BLOCKS, first_nonfinite

_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")


def check_gguf_contents(gf: GGUFFile) -> None:
    """The layer count and the finite values of an opened GGUF; a CheckpointError names what is wrong."""
    check_layer_count(gf)
    check_finite(gf)


def check_layer_count(gf: GGUFFile) -> None:
    """`{arch}.block_count` equals the layers the tensors hold: blk.0 .. blk.{count-1}, every one present."""
    arch = gf.metadata.get("general.architecture")
    key = f"{arch}.block_count"
    count = gf.metadata.get(key)
    if type(count) is not int or count <= 0:
        raise CheckpointError(f"{gf.path}: {key} is {count!r}, not a positive layer count; re-convert the GGUF")
    layers = {int(m[1]) for name in gf.tensors if (m := _BLOCK_TENSOR.match(name))}
    missing = sorted(set(range(count)) - layers)
    if missing:
        held = f"layers 0-{max(layers)}" if layers else "no layer tensors"
        raise CheckpointError(f"{gf.path}: {key} is {count} but the file holds {held}; the tensors of layer "
                              f"{missing[0]} (blk.{missing[0]}.*) are missing; the header is corrupt or the file is "
                              "not this model: re-download it")
    extra = sorted(layers - set(range(count)))
    if extra:
        raise CheckpointError(f"{gf.path}: {key} is {count} but the file has tensors of layer {extra[0]} "
                              f"(blk.{extra[0]}.*); the header is corrupt: re-download it")


def check_finite(gf: GGUFFile) -> None:
    """Every tensor in a format eagle-trt reads de-quantizes to finite weights (its scale fields are finite)."""
    for t in gf.tensors.values():
        fmt = GGML_FORMATS.get(t.type_name)
        if fmt is None or not t.nbytes:
            continue
        bad = first_nonfinite(fmt, torch.from_numpy(gf.raw(t)))
        if bad is not None:
            raise CheckpointError(f"{gf.path}: tensor {t.name} ({t.type_name}) has a non-finite "
                                  f"{_what(fmt)} at {_where(fmt, bad)}; the file is corrupt: re-download it")


def _what(fmt: str) -> str:
    return "value (inf or NaN)" if BLOCKS[fmt][0] == 1 else "block scale (inf or NaN)"


def _where(fmt: str, index: int) -> str:
    return f"element {index}" if BLOCKS[fmt][0] == 1 else f"block {index}"
