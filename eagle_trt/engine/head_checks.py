"""Draft-head checks: which layout a head has, that every tensor has the shape its config implies, and that its values
are sane (finite weights, a d2t / t2d vocabulary map inside the target's vocabulary and consistent with itself).

`build` runs them on a checkpoint's draft (shapes from safetensors headers, eagle_trt.engine.checkpoint); `convert
--head` and `export` run `check_head` on a head already in memory, the same checks, before anything is written.
Every error names the file and the tensor or field, and says what to do.

    >>> head_kind({"fc.weight": [64, 128], "layers.0.self_attn.q_proj.weight": [64, 64]}, 64)
    'eagle1'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from eagle_trt.config import EagleArchitecture
from eagle_trt.errors import CheckpointError
from eagle_trt.quant_blocks import all_finite

_OPTIONAL_TENSORS = {"lm_head.weight", "d2t", "t2d", "embed_tokens.weight", "fc.bias"}


def head_kind(shapes: dict[str, list[int]], hidden: int) -> str:
    """'eagle1' for an EAGLE-1/2 head (fc over [embedding ; hidden], H-wide q_proj input), else 'eagle3'.

    Anything ambiguous counts as EAGLE-3, so the EAGLE-3 checks name what is wrong with it.
    """
    if any(k.endswith("hidden_norm.weight") for k in shapes):
        return "eagle3"
    q = shapes.get("layers.0.self_attn.q_proj.weight")
    if shapes.get("fc.weight") == [hidden, 2 * hidden] and q is not None and q[1:] == [hidden]:
        return "eagle1"
    return "eagle3"


def check_eagle3_shapes(shapes, path, cfg_path, arch, kv, head_dim, n_aux) -> None:
    """Every EAGLE-3 head tensor present with the shape the config implies, and nothing else."""
    H, I, q = arch.hidden_size, arch.intermediate_size, arch.num_attention_heads * head_dim
    layers = sorted({k.split(".")[1] for k in shapes if k.split(".")[0] == "layers"})
    # EAGLE-3 heads have one decoder layer, and that is all the torch runtime executes: a deeper
    # head would run with its extra layers silently skipped.
    if arch.num_hidden_layers != 1 or layers != ["0"]:
        raise CheckpointError(
            f"'{path}' has decoder layers {layers} and '{cfg_path}' says num_hidden_layers "
            f"{arch.num_hidden_layers}; only single-layer EAGLE-3 heads are supported"
        )
    # The layer reads [token embedding ; fused hidden] concatenated, hence 2*H-wide q/k/v inputs.
    want = {
        "fc.weight": [H, n_aux * H],
        "norm.weight": [H],
        "layers.0.self_attn.q_proj.weight": [q, 2 * H],
        "layers.0.self_attn.k_proj.weight": [kv * head_dim, 2 * H],
        "layers.0.self_attn.v_proj.weight": [kv * head_dim, 2 * H],
        "layers.0.self_attn.o_proj.weight": [H, q],
        "layers.0.mlp.gate_proj.weight": [I, H],
        "layers.0.mlp.up_proj.weight": [I, H],
        "layers.0.mlp.down_proj.weight": [H, I],
        "layers.0.input_layernorm.weight": [H],
        "layers.0.hidden_norm.weight": [H],
        "layers.0.post_attention_layernorm.weight": [H],
    }
    if "fc.bias" in shapes:
        want["fc.bias"] = [H]
    for key, shape in want.items():
        if key not in shapes:
            raise CheckpointError(
                f"'{path}' has no tensor {key} (expected EAGLE-3 layers.0.* or midlayer.* names)"
            )
        if shapes[key] != shape:
            raise CheckpointError(
                f"'{path}': {key} has shape {shapes[key]}, expected {shape} (hidden_size {H}, "
                f"{arch.num_attention_heads}x{head_dim} heads, {kv} kv heads, intermediate_size {I}, "
                f"{n_aux} aux layers in '{cfg_path}'); the head and its config disagree: re-export it"
            )
    unknown = sorted(set(shapes) - set(want) - _OPTIONAL_TENSORS)
    if unknown:
        raise CheckpointError(f"'{path}' has unexpected tensors {unknown[:3]}: not an EAGLE-3 draft head")


def check_eagle1_shapes(shapes, path, cfg_path, arch, kv, head_dim, vocab) -> None:
    """EAGLE-1/2 head: fc over [embedding ; hidden] and num_hidden_layers plain Llama decoder layers."""
    H, I, q = arch.hidden_size, arch.intermediate_size, arch.num_attention_heads * head_dim
    layers = sorted({int(k.split(".")[1]) for k in shapes if k.startswith("layers.") and k.split(".")[1].isdigit()})
    if layers != list(range(arch.num_hidden_layers)):
        raise CheckpointError(
            f"'{path}' has decoder layers {layers} but '{cfg_path}' says num_hidden_layers {arch.num_hidden_layers}"
        )
    want = {"fc.weight": [H, 2 * H]}
    optional = {"fc.bias": [H], "embed_tokens.weight": [vocab, H], "lm_head.weight": None, "d2t": None, "t2d": None}
    for i in layers:
        p = f"layers.{i}."
        want.update({
            p + "self_attn.q_proj.weight": [q, H], p + "self_attn.k_proj.weight": [kv * head_dim, H],
            p + "self_attn.v_proj.weight": [kv * head_dim, H], p + "self_attn.o_proj.weight": [H, q],
            p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H], p + "mlp.down_proj.weight": [H, I],
            p + "post_attention_layernorm.weight": [H],
        })  # fmt: skip
        optional[p + "input_layernorm.weight"] = [H]  # EAGLE-1 drops it on layer 0
    for key, shape in want.items():
        if key not in shapes:
            raise CheckpointError(f"'{path}' has no tensor {key} (EAGLE-1/2 head layout)")
        if shapes[key] != shape:
            raise CheckpointError(f"'{path}': {key} has shape {shapes[key]}, expected {shape} (EAGLE-1/2 head)")
    for key, shape in shapes.items():
        if key in want:
            continue
        if key not in optional:
            raise CheckpointError(f"'{path}' has unexpected tensor {key}: not an EAGLE-1/2 draft head")
        if optional[key] is not None and shape != optional[key]:
            raise CheckpointError(f"'{path}': {key} has shape {shape}, expected {optional[key]}")


def check_kv_scales(path: Path, target_layers: int) -> Path | None:
    """Validate optional FP8 KV scales; None when the file is absent.

    Layout: target.k_scales / target.v_scales [num_layers] and draft.k_scales / draft.v_scales [1],
    float32, finite and > 0 (a stored entry is value / scale, so a scale is amax / 448).
    """
    if not path.is_file():
        return None
    want = {"target.k_scales": [target_layers], "target.v_scales": [target_layers],
            "draft.k_scales": [1], "draft.v_scales": [1]}  # fmt: skip
    try:
        with safe_open(str(path), "pt") as fh:
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own error types for bad files
        raise CheckpointError(f"'{path}' is not a readable safetensors file: {exc}") from exc
    if set(tensors) != set(want):
        raise CheckpointError(f"'{path}' must hold exactly {sorted(want)} (has {sorted(tensors)})")
    for key, shape in want.items():
        t = tensors[key]
        if list(t.shape) != shape or str(t.dtype) != "torch.float32":
            raise CheckpointError(
                f"'{path}': {key} is {str(t.dtype).replace('torch.', '')}{list(t.shape)}, expected float32{shape}"
            )
        if not all(math.isfinite(v) and v > 0 for v in t.tolist()):
            raise CheckpointError(f"'{path}': {key} must be finite and > 0")
    return path


def check_draft_vocab(shapes, dcfg, path, cfg_path, H, V) -> int:
    """Draft vocab = lm_head rows (the target's V without one), as draft_vocab_size says; d2t's shape fits it (its
    values: check_head_values)."""
    head = shapes.get("lm_head.weight")
    vocab = head[0] if head else V  # no lm_head: the draft reuses the target's
    if head is not None and (len(head) != 2 or head[1] != H or not 1 <= vocab <= V):
        raise CheckpointError(f"'{path}': lm_head.weight has shape {head}, expected [<= {V}, {H}]")
    declared = dcfg.get("draft_vocab_size", vocab)
    if declared != vocab or type(declared) is not int:
        raise CheckpointError(
            f"draft_vocab_size ({declared!r}) in '{cfg_path}' does not match "
            f"lm_head.weight rows ({vocab}) in '{path}' (the target's vocab is {V}); set it to {vocab}"
        )
    if "d2t" not in shapes:
        if vocab != V:
            raise CheckpointError(f"'{path}' has a {vocab}-token draft vocab (target: {V}) but no d2t map")
        return vocab
    if shapes["d2t"] != [vocab]:
        raise CheckpointError(f"'{path}': d2t has shape {shapes['d2t']}, expected [{vocab}]")
    return vocab


def check_head_values(tensors: dict[str, torch.Tensor], path, V: int, draft_vocab: int) -> None:
    """Every floating tensor finite; d2t (target id = draft id + d2t[draft id]) integer and one-to-one into the
    target vocab [0, V); t2d, when present, the [V] mask of exactly the target ids d2t reaches."""
    for name in sorted(tensors):
        t = tensors[name]
        if t.is_floating_point() and not all_finite(t):
            raise CheckpointError(f"'{path}': tensor {name} holds inf or NaN values; the head is corrupt: retrain or "
                                  "re-export it")
    d2t = tensors.get("d2t")
    ids = torch.arange(draft_vocab) if d2t is None else _target_ids(d2t, path, V)
    if "t2d" in tensors:
        _check_t2d(tensors["t2d"], ids, path, V)


def _target_ids(d2t: torch.Tensor, path, V: int) -> torch.Tensor:
    """The target id of every draft id, each in [0, V) and none twice."""
    if d2t.is_floating_point() or d2t.dtype == torch.bool or d2t.dim() != 1:
        raise CheckpointError(f"'{path}': d2t is {str(d2t.dtype).replace('torch.', '')}{list(d2t.shape)}; it must "
                              "be 1-D integer offsets (target id = draft id + d2t[draft id]); re-export the head")
    offsets = d2t.long()
    ids = torch.arange(offsets.numel()) + offsets  # an offset near the int64 limit wraps negative: refused below
    outside = ((ids < 0) | (ids >= V)).nonzero()
    if outside.numel():
        i = int(outside[0, 0])
        raise CheckpointError(f"'{path}': d2t[{i}] = {int(offsets[i])} maps draft id {i} to target id {int(ids[i])}, "
                              f"outside the target vocab [0, {V}); this head was made for another vocabulary")
    if torch.unique(ids).numel() != ids.numel():
        raise CheckpointError(f"'{path}': d2t maps two draft ids to one target id; each draft token must stand for "
                              "its own target token: re-export the head")
    return ids


def _check_t2d(t2d: torch.Tensor, ids: torch.Tensor, path, V: int) -> None:
    """t2d: a [V] bool (or 0/1) mask, True exactly at the target ids the draft vocab holds."""
    if list(t2d.shape) != [V] or t2d.is_floating_point() or (t2d.dtype != torch.bool and bool(
            ((t2d != 0) & (t2d != 1)).any())):
        raise CheckpointError(f"'{path}': t2d is {str(t2d.dtype).replace('torch.', '')}{list(t2d.shape)}; it must be "
                              f"a [{V}] bool mask of the target ids in the draft vocab; re-export the head")
    want = torch.zeros(V, dtype=torch.bool)
    want[ids] = True
    differ = (t2d.bool() != want).nonzero()
    if differ.numel():
        tid = int(differ[0, 0])
        raise CheckpointError(f"'{path}': t2d and d2t disagree at target id {tid} (t2d says "
                              f"{'in' if bool(t2d[tid]) else 'not in'} the draft vocab); re-export the head")


def config_int(data: dict, key: str, path: Path, default: int | None = None) -> int:
    """data[key] as a positive int (`default` when absent or null), else a CheckpointError naming the field."""
    value = data.get(key)
    if value is None:
        value = default  # absent or null ("head_dim": null is common)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"'{path}' needs a positive integer {key} (got {value!r}); fix it there")
    return value


def head_architecture(dcfg: dict, path: Path, positions: int) -> tuple[EagleArchitecture, int, int]:
    """(the head's architecture, its kv heads, its head_dim) from its config.json, every field a positive int."""
    arch = EagleArchitecture(
        hidden_size=config_int(dcfg, "hidden_size", path),
        num_attention_heads=config_int(dcfg, "num_attention_heads", path),
        intermediate_size=config_int(dcfg, "intermediate_size", path),
        num_hidden_layers=config_int(dcfg, "num_hidden_layers", path, 1),
        max_position_embeddings=config_int(dcfg, "max_position_embeddings", path, positions),
    )
    heads_kv = config_int(dcfg, "num_key_value_heads", path, arch.num_attention_heads)
    head_dim = config_int(dcfg, "head_dim", path, arch.hidden_size // arch.num_attention_heads)
    return arch, heads_kv, head_dim


def check_aux_ids(aux, layers: int | None, cfg_path) -> list[int]:
    """The aux layer ids: a non-empty list of distinct layers of the target (of its `layers`, when known)."""
    top = layers if layers is not None else math.inf
    if not isinstance(aux, list) or not aux or not all(type(i) is int and 0 <= i < top for i in aux) or len(
            set(aux)) != len(aux):
        of = f"the {layers}-layer target" if layers is not None else "the target"
        raise CheckpointError(f"aux layer ids {aux} in '{cfg_path}' are not distinct layers of {of} "
                              "(eagle_aux_hidden_state_layer_ids); this head was trained for another model")
    return aux


@dataclass(frozen=True)
class TargetDims:
    """What a head is checked against: the target's hidden size, decoder layers (None: unknown) and vocab size."""

    hidden: int
    layers: int | None
    vocab: int


def check_head(cfg: dict, tensors: dict[str, torch.Tensor], path: Path, cfg_path: Path, target: TargetDims
               ) -> list[int]:
    """`build`'s checks of an EAGLE-3 head, on one in memory (tensors under layers.0.* names): its config's fields,
    every tensor's shape, the aux layer ids, the draft vocab and the values. Returns the aux layer ids."""
    arch, heads_kv, head_dim = head_architecture(cfg, cfg_path, 1)
    if arch.hidden_size != target.hidden:
        raise CheckpointError(f"draft hidden_size ({arch.hidden_size}) in '{cfg_path}' does not match the target "
                              f"hidden_size ({target.hidden}); this head was trained for another model")
    aux = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    aux = check_aux_ids(aux, target.layers, cfg_path)
    shapes = {k: list(t.shape) for k, t in tensors.items()}
    check_eagle3_shapes(shapes, path, cfg_path, arch, heads_kv, head_dim, len(aux))
    vocab = check_draft_vocab(shapes, cfg, path, cfg_path, target.hidden, target.vocab)
    check_head_values(tensors, path, target.vocab, vocab)
    return aux
