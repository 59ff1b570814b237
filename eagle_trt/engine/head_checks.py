"""Draft-head tensor checks: which layout a head has, and that every tensor has the shape it implies.

Shapes come from safetensors headers (eagle_trt.engine.checkpoint reads them); only d2t and the KV
scales are read as values. Every error names the file and the tensor.

    >>> head_kind({"fc.weight": [64, 128], "layers.0.self_attn.q_proj.weight": [64, 64]}, 64)
    'eagle1'
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open

from eagle_trt.errors import CheckpointError

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
                f"{n_aux} aux layers)"
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
    """Draft vocab = lm_head rows; d2t (draft id -> target id offset) must stay inside the target vocab."""
    head = shapes.get("lm_head.weight")
    vocab = head[0] if head else V  # no lm_head: the draft reuses the target's
    if head is not None and (head[1] != H or vocab > V):
        raise CheckpointError(f"'{path}': lm_head.weight has shape {head}, expected [<= {V}, {H}]")
    if dcfg.get("draft_vocab_size", vocab) != vocab:
        raise CheckpointError(
            f"draft_vocab_size ({dcfg['draft_vocab_size']}) in '{cfg_path}' does not match "
            f"lm_head.weight rows ({vocab}) in '{path}'"
        )
    if "d2t" not in shapes:
        if vocab != V:
            raise CheckpointError(f"'{path}' has a {vocab}-token draft vocab (target: {V}) but no d2t map")
        return vocab
    if shapes["d2t"] != [vocab]:
        raise CheckpointError(f"'{path}': d2t has shape {shapes['d2t']}, expected [{vocab}]")
    with safe_open(str(path), "pt") as fh:
        d2t = fh.get_tensor("d2t")
    ids = torch.arange(vocab) + d2t.long()
    if d2t.is_floating_point() or int(ids.min()) < 0 or int(ids.max()) >= V:
        raise CheckpointError(f"'{path}': d2t maps draft ids outside the target vocab [0, {V})")
    return vocab
