"""Which of a model's weights an engine keeps as GGUF blocks, and making them: `build` with `weights: q8_0` (or
q4_0, q4_1) quantizes the projections and the LM head of a float checkpoint; a checkpoint that already holds a
GGUF's blocks (its `gguf_blocks.json`, written by `convert`) keeps them as they are with `weights: auto`.

Embeddings and norms stay in the engine's float dtype. A model with tied embeddings gets its LM head's blocks as a
tensor of its own (`lm_head.weight`): the embedding lookup keeps the float table.

    table = plan(source, "q8_0", tied=True)         # {engine tensor: BlockPlan}
    data = produce(table["lm_head.weight"], read)   # uint8 [out, bytes per row]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eagle_trt.errors import InputError

LM_HEAD = "lm_head.weight"
EMBED = "model.embed_tokens.weight"


@dataclass(frozen=True)
class BlockPlan:
    """One engine tensor in blocks: its format, logical [out, in] shape, and the checkpoint tensor it comes from."""

    format: str
    shape: tuple[int, int]
    source: str
    kept: bool = False  # already the checkpoint's blocks (copied byte for byte)

    @property
    def stored_shape(self) -> tuple[int, int]:
        from eagle_trt.models.block_weights import row_bytes

        return (self.shape[0], row_bytes(self.format, self.shape[1]))


def is_projection(name: str) -> bool:
    """A Llama-family projection weight (q, k, v, o, gate, up, down) or the LM head, by its HF name."""
    from eagle_trt.models.block_weights import PROJECTION_SUFFIXES

    return name == LM_HEAD or (name.startswith("model.layers.") and name.endswith(PROJECTION_SUFFIXES))


_HEAD_PROJECTION = re.compile(r"(layers\.0|midlayer)\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")


def is_draft_projection(name: str) -> bool:
    """A projection of a draft: a draft model's (as a target's), or an EAGLE-3 head's (fc, its one layer's, its own
    LM head), by the names the engine stores."""
    return is_projection(name) or name == "fc.weight" or bool(_HEAD_PROJECTION.fullmatch(name))


def quantize_dict(tensors: dict, weights: str, tied: bool = False, field: str = "draft_weights",
                  kept_dir=None) -> tuple[dict, dict]:
    """A draft's tensors (all in memory: a head or a small model) with its projections quantized to `weights` ->
    (the tensors, blocks.json's entries); "float" changes nothing; "auto" takes the blocks convert kept in
    `kept_dir` (a GGUF draft model's), and nothing where there are none."""
    if weights == "float":
        return tensors, {}
    kept_tensors, kept = _kept(kept_dir) if weights == "auto" else ({}, {})
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    plans = plan({n: s for n, s in shapes.items() if is_draft_projection(n) or n == EMBED}, weights, kept, tied=tied,
                 field=field, projections=is_draft_projection)
    out = {n: t for n, t in tensors.items() if n not in plans}
    out.update({n: produce(p, lambda name, k: kept_tensors[name] if k else tensors[name]) for n, p in plans.items()})
    return out, table(plans)


def _kept(kept_dir) -> tuple[dict, dict]:
    """(the kept blocks, their table) of a checkpoint dir, or two empty dicts without them."""
    from pathlib import Path

    from eagle_trt.models import block_weights

    table_ = block_weights.read_table(Path(kept_dir), block_weights.KEPT_TABLE) if kept_dir is not None else {}
    if not table_:
        return {}, {}
    from safetensors.torch import load_file

    from eagle_trt.quant_blocks import check_finite

    path = Path(kept_dir) / block_weights.KEPT_FILE
    blocks = load_file(str(path))
    for name, e in table_.items():
        if name in blocks:
            check_finite(blocks[name], e["format"], name, path)
    return blocks, table_


def plan(shapes: dict[str, tuple[int, ...]], weights: str, kept: dict[str, dict] | None = None,
         tied: bool = False, field: str = "weights", projections=is_projection) -> dict[str, BlockPlan]:
    """The engine's block tensors for a checkpoint whose tensors have these shapes: `weights` a format build makes
    (every projection and the LM head quantized from the float weights, even where a GGUF's blocks are kept: its
    de-quantized values re-quantized), "auto" (the checkpoint's own blocks, `kept`, and nothing more), or "float"
    (none). An input size the format's blocks do not divide is an InputError naming the tensor."""
    from eagle_trt.models import block_weights

    kept = kept or {}
    if weights == "float":
        return {}
    if weights == "auto":
        return {name: BlockPlan(e["format"], tuple(e["shape"]), name, kept=True) for name, e in kept.items()}
    names = [n for n in shapes if projections(n)]
    if tied and LM_HEAD not in shapes and EMBED in shapes:
        names.append(LM_HEAD)
    out = {}
    for name in sorted(names):
        src = EMBED if name == LM_HEAD and LM_HEAD not in shapes else name
        shape = tuple(shapes[src])
        if len(shape) != 2 or shape[1] % block_weights.block_elems(weights):
            small = len(shape) == 2 and shape[1] % block_weights.block_elems("q8_0") == 0  # 32-blocks fit
            raise InputError(f"{field}: {weights}: tensor '{src}' {list(shape)} has an input size that is not a "
                             f"multiple of {block_weights.block_elems(weights)} ({weights}'s block); use "
                             + (f"{field}: q4_0 or q8_0 (blocks of 32) or " if small else "")
                             + f"{field}: float for this model")
        out[name] = BlockPlan(weights, shape, src)
    return out


def produce(p: BlockPlan, read):
    """The uint8 rows of blocks of one planned tensor; `read(name, kept)` gives a checkpoint tensor (float, or with
    kept the GGUF's uint8 blocks, as they are)."""
    from eagle_trt.models import block_weights

    if p.kept:
        return read(p.source, True)
    return block_weights.quantize(read(p.source, False), p.format).segments[0].data


def table(plans: dict[str, BlockPlan]) -> dict[str, dict]:
    """blocks.json's entries for the planned tensors."""
    return {name: {"format": p.format, "shape": list(p.shape)} for name, p in plans.items()}
