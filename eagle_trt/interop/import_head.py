"""Heads in any engine's layout -> eagle-trt's draft dir, checked against the target they will run on.

    fmt = import_head(Path("heads/x"), Path("ckpt/draft"), target_config)   # target_config: target/config.json's dict

The draft dir's tensor names say which computation the runtime runs (`models/draft_head.py`): `layers.0.*` for
modelopt's double norm, `midlayer.*` for hidden_norm only. So a head trained the engines' way (vLLM, SGLang,
speculators, the official EAGLE release) is written with `midlayer.*` names, and a head eagle-trt trained and
exported comes back with `layers.0.*`: the same computation either way it travelled.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_trt.engine.datastore_file import DATASTORE_NAME
from eagle_trt.engine.head_checks import TargetDims, check_head
from eagle_trt.errors import CheckpointError
from eagle_trt.interop.detect import NOTE_NAME, detect_format
from eagle_trt.interop.formats import FORMATS
from eagle_trt.interop.head_blocks import Q8_KEY, unpack_q8_0
from eagle_trt.interop.layout import LLAMA_FIELDS, OURS, Head, our_ids_from, rename
from eagle_trt.models import block_weights
from eagle_trt.models.weights import load_safetensors, read_json

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def read_head_dir(head_dir: Path) -> tuple[dict, dict[str, torch.Tensor], dict | None]:
    """(config.json, tensors, eagle_trt.json or None) of a head dir; weights shipped as q8_0 rows
    (`head_blocks.py`), or kept in blocks by an engine's build, come back de-quantized."""
    note = head_dir / NOTE_NAME
    cfg, tensors = read_json(head_dir / CONFIG), load_safetensors(head_dir / WEIGHTS)
    tensors = unpack_q8_0(tensors, _metadata(head_dir / WEIGHTS), str(head_dir / WEIGHTS))
    # an engine's draft built with draft_weights in blocks: blocks.json names them
    for name, table in block_weights.read_table(head_dir).items():
        if name in tensors:
            rows = block_weights.BlockTensors({name: tensors[name]}, {name: table}, head_dir / WEIGHTS).pop(name)
            tensors[name] = block_weights.dequantize(rows)
    return cfg, tensors, read_json(note) if note.is_file() else None


def _metadata(path: Path) -> dict[str, str] | None:
    """A safetensors file's metadata (None for a sharded head, whose index carries none of it)."""
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def _our_config(fmt_name: str, cfg: dict, ids: list[int], target: dict, source: str) -> dict:
    """eagle-trt's draft config (the fields `convert` writes) from an engine's config."""
    layer = cfg.get("transformer_layer_config") if fmt_name == "speculators" else cfg
    if not isinstance(layer, dict):
        raise CheckpointError(f"{source}: transformer_layer_config is missing")
    out = {k: layer[k] for k in LLAMA_FIELDS if layer.get(k) is not None}
    for key in ("hidden_size", "num_attention_heads", "intermediate_size"):
        if key not in out:
            raise CheckpointError(f"{source}: missing field {key!r}")
    out.setdefault("vocab_size", target["vocab_size"])
    out.update(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
        draft_vocab_size=int(cfg.get("draft_vocab_size") or layer.get("draft_vocab_size") or out["vocab_size"]),
        target_hidden_size=int(cfg.get("target_hidden_size") or out["hidden_size"]),
        target_num_hidden_layers=int(target["num_hidden_layers"]), eagle_aux_hidden_state_layer_ids=ids,
        eagle_config={"eagle_aux_hidden_state_layer_ids": ids},
    )
    if cfg.get("norm_before_residual"):  # the residual is the normed feature (models/draft_head.py reads this)
        out["norm_before_residual"] = True
    return out


def _check_target(cfg: dict, target: dict, tensors: dict, source: str) -> None:
    """Hidden size, vocab and the fused feature's width against the target, each a one-line error."""
    for key in ("hidden_size", "vocab_size"):
        if int(cfg[key]) != int(target[key]):
            raise CheckpointError(f"{source}: {key} {cfg[key]} does not match the target's {target[key]}; "
                                  "this head was trained for another model")
    if int(cfg["target_hidden_size"]) != int(target["hidden_size"]):
        raise CheckpointError(f"{source}: target_hidden_size {cfg['target_hidden_size']} is not the target's "
                              f"hidden_size {target['hidden_size']}")
    fc = tensors.get("fc.weight")
    n_aux = len(cfg["eagle_aux_hidden_state_layer_ids"])
    if fc is None or list(fc.shape) != [int(cfg["hidden_size"]), n_aux * int(target["hidden_size"])]:
        raise CheckpointError(f"{source}: fc.weight has shape {None if fc is None else list(fc.shape)}, expected "
                              f"[{cfg['hidden_size']}, {n_aux} x {target['hidden_size']}] for {n_aux} layer ids")


def load_head(head_dir: Path, target: dict) -> tuple[str, Head]:
    """(the detected format, the head in eagle-trt's layout) of a head dir in any supported layout."""
    cfg, tensors, note = read_head_dir(head_dir)
    source = str(head_dir / CONFIG)
    fmt_name = detect_format(cfg, list(tensors), note, source)
    fmt = FORMATS[fmt_name]
    if cfg.get("norm_before_fc"):
        raise CheckpointError(f"{source}: norm_before_fc is true (an RMSNorm over the concatenated features before fc), "
                              "which eagle-trt's runtime does not compute; use a head trained without it")
    layers = int(target["num_hidden_layers"])
    ids = our_ids_from(fmt, cfg, layers, source)
    if note is not None:
        if note.get("aux_layer_ids") != ids:
            raise CheckpointError(f"{source}: ids read {ids} but {NOTE_NAME} says {note.get('aux_layer_ids')}")
        prenorm = bool(note["hidden_prenorm"])
    else:
        prenorm = fmt.double_norm
    ours = rename(rename(tensors, fmt.layer_prefix, OURS), "midlayer.", OURS)
    if note is not None and note.get("lm_head_from_target"):
        ours.pop("lm_head.weight", None)
    config = _our_config(fmt_name, cfg, ids, target, source)
    _check_target(config, target, ours, source)
    # what `build` checks of the head it writes, here before anything is: shapes, vocab maps (t2d against d2t
    # before t2d is dropped: the runtime derives it), finite values
    check_head(config, ours, head_dir / WEIGHTS, head_dir / CONFIG,
               TargetDims(int(target["hidden_size"]), layers, int(target["vocab_size"])))
    ours.pop("t2d", None)
    return fmt_name, Head(ours, config, prenorm, target_layers=layers)


def write_draft(head: Head, out_dir: Path) -> None:
    """The head as eagle-trt's draft dir: names by computation (see the module doc), config.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = head.tensors if head.hidden_prenorm else rename(head.tensors, OURS, "midlayer.")
    save_file({k: t.contiguous() for k, t in sorted(tensors.items())}, str(out_dir / WEIGHTS),
              metadata={"format": "pt"})
    (out_dir / CONFIG).write_text(json.dumps(head.config, indent=2) + "\n")


def _packed(head_dir: Path) -> bool:
    return Q8_KEY in (_metadata(head_dir / WEIGHTS) or {})


def import_head(head_dir: Path, out_dir: Path, target: dict) -> str:
    """Write `head_dir` (any supported layout) as eagle-trt's draft dir `out_dir`; returns the detected format.
    A modelopt head (eagle-trt's own) is copied byte for byte, unless it ships q8_0 rows (written out de-quantized)."""
    fmt_name, head = load_head(head_dir, target)
    out_dir.mkdir(parents=True, exist_ok=True)
    if fmt_name == "modelopt" and not (head_dir / NOTE_NAME).is_file() and not _packed(head_dir):
        for name in (CONFIG, WEIGHTS):
            shutil.copyfile(head_dir / name, out_dir / name)
    else:
        write_draft(head, out_dir)
    if (head_dir / DATASTORE_NAME).is_file():  # the prompt-lookup datastore that travels with a head
        shutil.copyfile(head_dir / DATASTORE_NAME, out_dir / DATASTORE_NAME)
    return fmt_name
