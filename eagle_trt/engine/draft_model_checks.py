"""Read-only checks of a checkpoint whose draft is a small language model (`convert --draft-model`).

    >>> is_model_draft({"model.embed_tokens.weight": [260, 64], "model.layers.0.mlp.up_proj.weight": [128, 64]})
    True

The draft dir is an HF model dir (config.json, model.safetensors, tokenizer files). It must be a model the torch
engine runs (`TargetSpec`), hold every decoder layer its config names, share the target's tokenizer (checked again
here on the saved files: a hand-assembled checkpoint gets the same one-line error as convert), and cover the
positions the engine's requests need.
"""

from __future__ import annotations

from pathlib import Path

from eagle_trt.errors import CheckpointError, ConfigError
from eagle_trt.models.spec import TargetSpec
from eagle_trt.tokenizer_match import first_difference, saved_tokenizer_terms


def is_model_draft(shapes: dict[str, list[int]]) -> bool:
    """A full causal LM's weights (HF names under model.), not an EAGLE head's."""
    return "model.embed_tokens.weight" in shapes or any(k.startswith("model.layers.") for k in shapes)


def check_model_draft(cfg, dcfg: dict, dcfg_path: Path, shapes: dict[str, list[int]], dweights: Path,
                      target_dir: Path) -> dict:
    """Every check of a draft model; returns the manifest's draft info."""
    if cfg.eagle_architecture is not None:
        raise ConfigError(f"eagle_architecture describes an EAGLE-3 head, but the checkpoint's draft is a model "
                          f"('{dcfg_path}'); remove eagle_architecture (or set it to null)")
    spec = TargetSpec.from_hf_config(dcfg, str(dcfg_path))
    want = {"model.embed_tokens.weight": [spec.vocab_size, spec.hidden_size], "model.norm.weight": [spec.hidden_size]}
    for name, shape in want.items():
        if shapes.get(name) != shape:
            raise CheckpointError(f"'{dweights}': {name} has shape {shapes.get(name)}, '{dcfg_path}' implies {shape}")
    layers = sorted({int(k.split(".")[2]) for k in shapes if k.startswith("model.layers.")})
    if layers != list(range(spec.num_layers)):
        raise CheckpointError(f"'{dweights}' has decoder layers {layers[:3]}..{layers[-3:]} but '{dcfg_path}' says "
                              f"num_hidden_layers {spec.num_layers}")
    need = cfg.max_input_len + cfg.max_output_len
    if need > spec.max_position_embeddings:
        raise ConfigError(f"max_input_len ({cfg.max_input_len}) + max_output_len ({cfg.max_output_len}) = {need} "
                          f"exceeds max_position_embeddings ({spec.max_position_embeddings}) of the draft model in "
                          f"'{dcfg_path}'")
    check_same_tokenizer(target_dir, dcfg_path.parent)
    return {"kind": "model", "hidden_size": spec.hidden_size, "draft_vocab_size": spec.vocab_size,
            "aux_layer_ids": []}


def check_same_tokenizer(target_dir: Path, draft_dir: Path) -> None:
    if not (draft_dir / "tokenizer.json").is_file():
        raise CheckpointError(f"no tokenizer.json in '{draft_dir}' to check against the target's",
                              hint="rewrite the checkpoint with `eagle-trt convert TARGET --draft-model SMALL`")
    diff = first_difference(*saved_tokenizer_terms(target_dir), *saved_tokenizer_terms(draft_dir))
    if diff is not None:
        raise CheckpointError(f"the draft model in '{draft_dir}' does not share the target's tokenizer: {diff}")
