"""The model families eagle-trt converts, builds and runs: one list, read by `convert` (HF model_type / GGUF
general.architecture) and by the runtime (config.json `architectures`).

All are the Llama decoder layer (RMSNorm, RoPE, grouped-query attention, a gated MLP), which is what the runtime's
forward implements; they differ in what the config switches on:
- Llama 2 / 3.x (incl. SmolLM2): RoPE `rope_type` default, linear or llama3 (3.1+: low frequencies divided by
  `factor`, a smooth blend between);
- Qwen2: q/k/v biases always, tied or untied embeddings, its own RoPE base;
- Qwen3: no biases, and an RMSNorm over each query and key head (before RoPE);
- Mistral: Llama's layout plus an optional sliding attention window, which the runtime does not take for this family:
  a model whose window is shorter than its context is refused (Mistral-7B-v0.1's 4096 of 32768), one without a
  window (v0.2 and later) runs;
- Gemma 3 (text): q/k norms, an RMSNorm on the attention and the MLP outputs before each residual add (besides the
  usual pre-norms), norms scaling by (1 + w), a GELU-tanh MLP, embeddings scaled by sqrt(hidden), tied embeddings,
  attention scaled by query_pre_attn_scalar^-0.5, and interleaved sliding-window (local RoPE base) and global
  layers, which the runtime runs as such (`TargetSpec.local_layers`).
RoPE scaling types other than these (yarn, dynamic, longrope, ...) and attention-logit softcapping are refused with
the field named (`check_config`), never run as something else.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle_trt.errors import CheckpointError

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class Family:
    model_type: str  # HF config model_type, GGUF general.architecture
    hf_class: str  # HF config architectures[0]
    label: str  # what users read
    attention_bias: bool  # q/k/v biases when the config does not say
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE (Qwen3, Gemma 3)
    gemma: bool = False  # Gemma 3's layer: sandwich norms, (1 + w) norms, GELU-tanh, scaled embeddings, windows
    gguf_arch: str = ""  # GGUF general.architecture when it is not model_type
    # Whether TensorRT-LLM's PyTorch backend runs EAGLE-3 on this architecture, and where that was read (its model
    # class takes spec_metadata and captures the aux hidden states: SpecDecOneEngineForCausalLM, docs/trtllm.md).
    trtllm_eagle3: bool = True
    trtllm_source: str = ""


FAMILIES = (
    Family("llama", "LlamaForCausalLM", "Llama 2/3.x (incl. SmolLM2)", False),
    Family("qwen2", "Qwen2ForCausalLM", "Qwen2 / Qwen2.5", True),
    Family("qwen3", "Qwen3ForCausalLM", "Qwen3 (dense)", False, qk_norm=True,
           trtllm_source="NVIDIA/TensorRT-LLM tensorrt_llm/_torch/models/modeling_qwen3.py @ 010bb95f: "
                         "Qwen3ForCausalLM(SpecDecOneEngineForCausalLM)"),
    Family("mistral", "MistralForCausalLM", "Mistral (no sliding window)", False),
    Family("gemma3_text", "Gemma3ForCausalLM", "Gemma 3 (text)", False, qk_norm=True, gemma=True,
           gguf_arch="gemma3", trtllm_eagle3=False,
           trtllm_source="NVIDIA/TensorRT-LLM tensorrt_llm/_torch/models/modeling_gemma3.py @ 00e7d103: "
                         "Gemma3ForCausalLM(DecoderModelForCausalLM), its layers take no spec_metadata"),
)
BY_TYPE = {f.model_type: f for f in FAMILIES} | {f.gguf_arch: f for f in FAMILIES if f.gguf_arch}
BY_CLASS = {f.hf_class: f for f in FAMILIES}


def family_label(hf_class: str) -> str:
    """What users read for a config's architectures[0] (`inspect`), or the class itself for one not listed."""
    family = BY_CLASS.get(hf_class)
    return family.label if family is not None else hf_class


def supported_labels() -> str:
    return ", ".join(f.label for f in FAMILIES)


def family_of_type(model_type: str, source) -> Family:
    """The family of a model_type (convert's check), or a CheckpointError naming what is supported."""
    if model_type not in BY_TYPE:
        raise CheckpointError(f"unsupported architecture {model_type!r} in {source}; eagle-trt converts "
                              f"{supported_labels()} models")
    return BY_TYPE[model_type]


def family_of_config(cfg: dict, source) -> Family:
    """The family a config.json declares (the runtime's check), the config's features checked (`check_config`)."""
    arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
    if arch not in BY_CLASS:
        raise CheckpointError(f"{source}: architecture '{arch}' is not supported by the torch engine (supported: "
                              f"{', '.join(BY_CLASS)})")
    check_config(cfg, source, BY_CLASS[arch])
    return BY_CLASS[arch]


def check_config(cfg: dict, source, family: Family | None = None) -> None:
    """Refuse what the runtime would not reproduce: a sliding window it does not run, a RoPE scaling type it does
    not implement, attention-logit softcapping, q/k norms together with q/k/v biases."""
    family = family or BY_TYPE.get(cfg.get("model_type", ""), FAMILIES[0])
    if not family.gemma:
        check_window(cfg, source)
    check_rope(cfg, source)
    if cfg.get("attn_logit_softcapping"):
        raise CheckpointError(f"{source}: attn_logit_softcapping {cfg['attn_logit_softcapping']} is not supported "
                              "(the attention kernels do not cap scores); use a model without it")
    if family.qk_norm and cfg.get("attention_bias"):
        raise CheckpointError(f"{source}: attention_bias with q/k norms is not supported")


def check_rope(cfg: dict, source) -> None:
    """Refuse a RoPE scaling type the runtime does not implement (models/layers.py), naming the field."""
    for where, params in rope_parameter_sets(cfg):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise CheckpointError(f"{source}: {where} rope_type {kind!r} is not supported (eagle-trt implements "
                                  f"{', '.join(ROPE_TYPES)}); use a model without it")


def rope_parameter_sets(cfg: dict) -> list[tuple[str, dict]]:
    """Every RoPE parameter dict a config holds, with the field it came from: transformers 4.x `rope_scaling`,
    5.x `rope_parameters` (flat, or one dict per layer type as Gemma 3's)."""
    out = []
    for field in ("rope_scaling", "rope_parameters"):
        value = cfg.get(field)
        if not isinstance(value, dict):
            continue
        if all(isinstance(v, dict) for v in value.values()) and value:
            out += [(f"{field}.{k}", v) for k, v in value.items()]
        else:
            out.append((field, value))
    return out


def check_window(cfg: dict, source) -> None:
    """Refuse a sliding attention window shorter than the context in a family whose windows the runtime does not
    run (all but Gemma 3): it attends to every earlier token, which would give other outputs than the model's own."""
    window = cfg.get("sliding_window")
    use = cfg.get("use_sliding_window", True)
    positions = int(cfg.get("max_position_embeddings", 2048))
    if use and isinstance(window, int) and 0 < window < positions:
        raise CheckpointError(f"{source}: sliding_window {window} is shorter than max_position_embeddings "
                              f"{positions}; eagle-trt attends to the whole context and would not reproduce this "
                              "model (use a release without a sliding window)")
