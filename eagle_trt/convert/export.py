"""Write the converted checkpoint directory, atomically.

Layout (what `eagle-trt build` reads):

    OUT/target/    config.json, model.safetensors, tokenizer files, generation_config.json
    OUT/draft/     config.json, model.safetensors    (modelopt's EAGLE-3 deployment export),
                   datastore.safetensors             (the training text, for prompt lookup; optional)
    OUT/convert.json

    from eagle_trt.convert.attach import attach_eagle3
    from eagle_trt.convert.export import staged_output, write_target, write_draft, write_manifest
    with staged_output("/tmp/ckpt", overwrite=True) as stage:   # a temp dir next to /tmp/ckpt
        write_target(model, tokenizer, stage / "target")       # before attach_eagle3(model)
        write_draft(attach_eagle3(model), stage / "draft")
        write_manifest(stage, {"steps": 0})
    # only now does /tmp/ckpt exist; an exception inside the block leaves nothing behind

Everything is built in a hidden sibling directory (same filesystem, so the final rename is atomic)
and renamed onto OUT at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from eagle_trt.eos import generation_eos
from eagle_trt.errors import InputError
from eagle_trt.staging import staged_dir, swap_into_place, sweep_stale

DEFAULT_SHARD_BYTES = 5 * 10**9  # transformers 4.x's default shard size ("5GB")
# Fields `eagle-trt build` and the runtime read from draft/config.json.
DRAFT_CONFIG_FIELDS = (
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
    "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings", "vocab_size",
    "draft_vocab_size", "eagle_aux_hidden_state_layer_ids", "num_hidden_layers", "target_hidden_size",
)


def check_output_dir(output_dir: str | Path, overwrite: bool) -> Path:
    """Fail fast (before any slow work) if OUT cannot be written; return its absolute path."""
    out = Path(output_dir).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise InputError(f"output path exists and is not a directory: {out}; choose another --output")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InputError(f"output directory is not empty: {out}; pass --force to replace it")
    return out


def _commit(stage: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished stage onto OUT; an existing OUT is swapped out, then deleted."""
    out = check_output_dir(out, overwrite)  # again: something may have appeared meanwhile
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    readable_by_all(stage)
    swap_into_place(stage, out)


def readable_by_all(root: Path) -> None:
    """Files 0644 and dirs 0755 under root: a checkpoint is shared data (safetensors writes its files 0600)."""
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


@contextlib.contextmanager
def staged_output(output_dir: str | Path, overwrite: bool = False):
    """Yield an empty temp dir next to OUT; on success it becomes OUT, on any error it is removed."""
    out = check_output_dir(output_dir, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(out.parent, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
        sweep_stale(out, ("partial", "old"))  # what converts killed outright left behind
    except OSError as e:
        raise InputError(f"cannot write next to {out} ({e.strerror}); choose another --output") from e
    with staged_dir(out, "partial") as stage:
        yield stage
        _commit(stage, out, overwrite)


def write_target(model, tokenizer, target_dir: Path, max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
    """Save the plain base model (fp32 safetensors, HF names; shards of at most max_shard_bytes with
    model.safetensors.index.json when it is larger) plus its tokenizer files. The tensors are written from where
    they lie, without a second copy of the model."""
    if hasattr(model, "eagle_module"):
        # save_pretrained would store eagle_module.* weights and an "EagleLlamaForCausalLM" class.
        raise ValueError("write_target needs the plain target: call it before attach_eagle3")
    generation = getattr(model, "generation_config", None)
    if generation is not None:  # every end token in one place: config.json's, generation_config's, the tokenizer's
        generation.eos_token_id = generation_eos(_target_config(model).eos_token_id, generation.eos_token_id,
                                                 tokenizer.eos_token_id)  # fmt: skip
    model.save_pretrained(target_dir, max_shard_size=max_shard_bytes)
    tokenizer.save_pretrained(target_dir)


def _target_config(model):
    return getattr(model.config, "text_config", None) or model.config


def write_draft(model, draft_dir: Path) -> dict:
    """Export the EAGLE-3 head with modelopt, complete its config.json, and return that config."""
    # Imported here: transformers takes seconds to import, and convert checks its inputs before that.
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the exporter reads config.torch_dtype: a deprecation warning
    try:
        model.get_exporter().export(draft_dir)
    finally:
        hf_logging.set_verbosity(verbosity)
    config_file = draft_dir / "config.json"
    config = json.loads(config_file.read_text())
    eagle, target = model.eagle_config, _target_config(model)
    # modelopt nests the aux layer ids under "eagle_config" and takes bos/eos from a default
    # LlamaConfig (1/2); the runtime wants them flat and equal to the target's.
    config.update(
        vocab_size=target.vocab_size,
        draft_vocab_size=eagle.draft_vocab_size,
        eagle_aux_hidden_state_layer_ids=list(eagle.eagle_aux_hidden_state_layer_ids),
        num_hidden_layers=eagle.num_hidden_layers,
        target_hidden_size=target.hidden_size,
        target_num_hidden_layers=target.num_hidden_layers,
        bos_token_id=target.bos_token_id,
        eos_token_id=target.eos_token_id,
        pad_token_id=target.pad_token_id,
    )
    params = dict(getattr(eagle, "rope_parameters", None) or eagle.rope_scaling or {})
    config["rope_scaling"] = params
    config["rope_theta"] = params.get("rope_theta", config.get("rope_theta"))
    for key in DRAFT_CONFIG_FIELDS:
        if config.get(key) is None and key != "rope_scaling":
            config[key] = getattr(eagle, key)
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    return config


def write_manifest(out_dir: Path, data: dict) -> Path:
    """Write OUT/convert.json (provenance: source, versions, head shape)."""
    path = out_dir / "convert.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path
