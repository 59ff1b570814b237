"""A head's tensors and config in one engine's layout, and back: pure dict work, no files.

    tensors, config = to_format(FORMATS["vllm"], head)      # head: Head (eagle-trt's own layout)
    head = from_format(FORMATS["vllm"], tensors, config, target_layers=30, source="x/config.json")

`Head` is eagle-trt's layout: modelopt's tensor names (`layers.0.*`), the draft config `convert` writes, ids meaning
"output of layer i", and `hidden_prenorm`, the computation it was trained with (True: modelopt's double norm).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_trt.engine.trtllm_hf_files import draft_config, draft_tensor_names
from eagle_trt.errors import CheckpointError, InputError
from eagle_trt.interop.formats import BEFORE, Format, engine_default_ids

OURS = "layers.0."
# The Llama fields every engine's config reader takes from a draft config (HF LlamaConfig names).
LLAMA_FIELDS = (
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
    "rope_theta", "rope_scaling", "max_position_embeddings", "vocab_size", "hidden_act", "attention_bias", "mlp_bias",
    "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype",
)


@dataclass
class Head:
    tensors: dict[str, torch.Tensor]
    config: dict
    hidden_prenorm: bool
    target_layers: int | None = None          # the target's decoder layer count, when known
    target_name: str | None = None            # what the head was trained for (a note, not checked)
    lm_head_from_target: bool = False         # lm_head.weight was copied in from the target on export
    target_dir: Path | None = None            # the target's HF dir beside the head, when there is one
    target_architectures: list[str] | None = None  # its config.json's, when known

    @property
    def aux_ids(self) -> list[int]:
        return aux_ids_of(self.config)


def aux_ids_of(cfg: dict) -> list[int] | None:
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    return [int(i) for i in ids] if ids else None


def rename(tensors: dict, src: str, dst: str) -> dict:
    return {dst + k[len(src):] if k.startswith(src) else k: t for k, t in tensors.items()}


def t2d_mask(d2t: torch.Tensor, vocab: int) -> torch.Tensor:
    """speculators' target->draft map: a bool [vocab] mask, True at the target ids the draft vocab holds."""
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[torch.arange(d2t.numel()) + d2t.long()] = True
    return mask


def to_format(fmt: Format, head: Head) -> tuple[dict, dict]:
    """(tensors, config.json) of `head` in `fmt`'s layout. The ids become the ones `fmt`'s engine reads for the
    same target layers."""
    ours = head.aux_ids
    if ours is None:
        raise CheckpointError("the head's config names no eagle_aux_hidden_state_layer_ids; convert it again")
    if fmt.name == "sglang" and ours[0] == 0:
        raise InputError(f"the head reads layer 0's output (ids {ours}): SGLang would take its id 1 for layer 1's "
                         "output (it adds 1 to ids starting at 1); SGLang cannot serve this head")
    normed_residual = bool(head.config.get("norm_before_residual"))
    if normed_residual and fmt.name not in ("vllm", "speculators"):
        raise InputError(f"the head's residual is its normed feature (norm_before_residual), which {fmt.engine} does "
                         "not compute; export it for vllm or speculators")
    ids = fmt.engine_ids(ours)
    if fmt.name == "trtllm":  # the bundle's own renaming (engine/trtllm_hf_files.py), so both read the same names
        tensors = draft_tensor_names(dict(head.tensors), 1)
    else:
        tensors = rename(dict(head.tensors), OURS, fmt.layer_prefix)
    tensors.pop("t2d", None)
    if fmt.writes_t2d and "d2t" in tensors:
        tensors["t2d"] = t2d_mask(tensors["d2t"], int(head.config["vocab_size"]))
    if fmt.config_style == "modelopt":
        cfg = dict(head.config, eagle_aux_hidden_state_layer_ids=ids)
        cfg["eagle_config"] = dict(cfg.get("eagle_config") or {}, eagle_aux_hidden_state_layer_ids=ids)
        # TensorRT-LLM's RoPE parser rejects modelopt's rope_scaling {rope_type: default}: the bundle's rewrite
        return tensors, draft_config(cfg) if fmt.name == "trtllm" else cfg
    return tensors, _engine_config(fmt, head, ids, normed_residual)


def _engine_config(fmt: Format, head: Head, ids: list[int], normed_residual: bool) -> dict:
    """config.json for the engines that read an HF Llama config (vLLM, SGLang) or speculators' own."""
    # rope_scaling {rope_type: default} (modelopt's) is no scaling: written as null beside rope_theta, the form every
    # engine's HF config reader takes (the bundle's rewrite, engine/trtllm_hf_files.py)
    llama = {k: v for k, v in draft_config(head.config).items() if k in LLAMA_FIELDS and v is not None}
    llama.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False,
                 draft_vocab_size=int(head.config.get("draft_vocab_size") or head.config["vocab_size"]))
    target_hidden = int(head.config.get("target_hidden_size") or head.config["hidden_size"])
    if fmt.config_style == "hf":
        return dict(llama, architectures=["LlamaForCausalLMEagle3"], target_hidden_size=target_hidden,
                    eagle_aux_hidden_state_layer_ids=ids, norm_before_residual=normed_residual,
                    eagle_config={"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True})
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": {k: v for k, v in llama.items() if k != "draft_vocab_size"},
        "draft_vocab_size": llama["draft_vocab_size"], "norm_before_residual": normed_residual,
        "target_hidden_size": target_hidden, "eagle_aux_hidden_state_layer_ids": ids,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            # `vllm serve DIR` loads the verifier named here as the target: null when the source does not say
            "verifier": {"name_or_path": head.target_name, "architectures": head.target_architectures},
        },
    }


def _their_ids(fmt: Format, cfg: dict, target_layers: int | None, source: str) -> list[int]:
    ids = aux_ids_of(cfg)
    if ids is None:
        if target_layers is None:
            raise CheckpointError(f"{source}: names no eagle_aux_hidden_state_layer_ids and the target's layer "
                                  "count is unknown; add the ids to the config")
        return fmt.our_ids(engine_default_ids(target_layers)) if fmt.id_meaning == BEFORE else None
    return fmt.our_ids(ids)


def our_ids_from(fmt: Format, cfg: dict, target_layers: int | None, source: str) -> list[int]:
    """The head's ids in eagle-trt's meaning (outputs of layers i), checked against the target's layer count."""
    ids = _their_ids(fmt, cfg, target_layers, source)
    if ids is None:  # "output" formats with no ids: modelopt's default
        ids = sorted({1, max(0, target_layers // 2 - 1), max(0, target_layers - 4)})
    if fmt.id_meaning == BEFORE and min(ids) < 0:
        raise CheckpointError(f"{source}: layer id 0 captures the embedding output, which eagle-trt's target does "
                              "not feed a head; use a head trained on decoder layers")
    if target_layers is not None and (min(ids) < 0 or max(ids) >= target_layers):
        raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids read layers {ids} of a "
                              f"{target_layers}-layer target; this head was trained for another model")
    return ids
