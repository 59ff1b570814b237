"""Attach a freshly initialised EAGLE-3 draft head to a Hugging Face causal LM with NVIDIA modelopt.

    from eagle_trt.convert.load_target import load_target
    from eagle_trt.convert.attach import attach_eagle3
    model, tok, info = load_target("/tmp/tiny-llama")
    model = attach_eagle3(model)                      # same object, now with model.eagle_module
    print(model.eagle_config.eagle_aux_hidden_state_layer_ids)

The head is modelopt's EAGLE-3 mode (aux hidden states from three target layers, fused by `fc`,
one Llama decoder layer whose first attention takes [embeds, hidden] of width 2H, a final norm).
Its shape is derived from the target, never from modelopt's defaults: those are sized for an 8B
Llama and use rope_theta=10000, which would silently mis-rotate positions for e.g. SmolLM2 (1e5).
"""

from __future__ import annotations

import contextlib
import importlib
import sys

import torch

from eagle_trt.errors import InputError

DRAFT_INIT_SEED = 0


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """modelopt's EAGLE-3 default: layers near the start, middle and end (deduplicated)."""
    # Imported here: an optional dependency (modelopt), absent unless the convert extra is installed.
    from modelopt.torch.speculative.plugins.hf_eagle import default_eagle_aux_layer_ids

    return default_eagle_aux_layer_ids(num_layers)


def _rope(config) -> tuple[float, dict]:
    """(rope_theta, rope_scaling dict) of the target; transformers 5 keeps both in rope_parameters."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        # One dict per layer type (Gemma 3): the head's one layer attends over the whole draft, as a global layer.
        params = dict(params.get("full_attention") or {})
    theta = getattr(config, "rope_theta", None) or params.get("rope_theta")
    if theta is None:
        raise ValueError(f"{config.model_type} config has no rope_theta")
    params.setdefault("rope_type", params.pop("type", "default"))
    params["rope_theta"] = float(theta)
    return float(theta), params


def eagle3_architecture(config, draft_vocab_size: int | None = None, intermediate_size: int | None = None) -> dict:
    """The `eagle_architecture_config` for a target HF config (merged over modelopt's defaults). The head's MLP is
    the target's width unless `intermediate_size` says otherwise (a narrower head drafts and trains for less)."""
    vocab = config.vocab_size
    if intermediate_size is not None and intermediate_size < 1:
        raise InputError(f"--head-intermediate-size must be >= 1; got {intermediate_size}")
    draft_vocab = vocab if draft_vocab_size is None else int(draft_vocab_size)
    if not 1 <= draft_vocab <= vocab:
        raise InputError(f"draft vocab size must be between 1 and the target vocab ({vocab}); got {draft_vocab}")
    theta, rope_scaling = _rope(config)
    return {
        "use_aux_hidden_state": True,
        "use_last_layernorm": True,
        "eagle_aux_hidden_state_layer_ids": default_aux_layer_ids(config.num_hidden_layers),
        "num_hidden_layers": 1,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        "intermediate_size": int(intermediate_size or config.intermediate_size),
        "hidden_act": getattr(config, "hidden_act", "silu"),
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "draft_vocab_size": draft_vocab,
        # modelopt's default is bfloat16; the exported config must describe the fp32 weights.
        "torch_dtype": "float32",
    }


def import_modelopt() -> None:
    """Import modelopt's speculative-decoding package now, while no model exists. Importing it keeps the frames that
    ran the import alive (one of its modules holds its caller's frame), and a frame that held a model as a local
    keeps that model alive after convert is done with it: gigabytes for a real model."""
    importlib.import_module("modelopt.torch.speculative")


def attach_eagle3(model, draft_vocab_size: int | None = None, seed: int = DRAFT_INIT_SEED,
                  intermediate_size: int | None = None):
    """Convert `model` in place into a modelopt EAGLE-3 model and return it.

    The head init is seeded (without disturbing the caller's RNG), so the same target and options
    always give the same untrained head. With a reduced draft vocab, `d2t` is all zeros: draft token
    i maps to target token i + d2t[i] = i until training fills in a frequency-based mapping.
    """
    # Imported here: an optional dependency (modelopt), absent unless the convert extra is installed.
    import modelopt.torch.speculative as mtsp

    config = {
        "eagle_architecture_config": eagle3_architecture(model.config, draft_vocab_size, intermediate_size),
        # Conversion is not training: torch.compile wrappers only add start-up cost here.
        "eagle_use_torch_compile": False,
        # modelopt would otherwise write a YaRN x32 rope_scaling into the exported draft config;
        # the draft must rotate positions exactly like the target it reads hidden states from.
        "eagle_export_rope_scaling": {},
    }
    with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(sys.stderr):
        # modelopt print()s progress ("Found base_model_path ..."); keep stdout clean for --json.
        torch.manual_seed(seed)
        mtsp.convert(model, [("eagle", config)])
    _flatten_head_rope(model.eagle_config, config["eagle_architecture_config"]["rope_scaling"])
    model.eval()
    return model


def _flatten_head_rope(eagle_config, rope: dict) -> None:
    """modelopt builds the head's config with the target's config class; Gemma 3's re-nests the RoPE parameters per
    layer type (and loses rope_theta), which the head's one Llama layer cannot read. Its RoPE is the target's global
    layers' (`_rope`), set back flat here before the head first runs."""
    params = getattr(eagle_config, "rope_parameters", None)
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        eagle_config.rope_parameters = dict(rope)
        eagle_config.rope_scaling = dict(rope)
        eagle_config.rope_theta = rope["rope_theta"]
