"""The model families eagle-trt converts, builds and runs: one list, read by `convert` (HF model_type / GGUF
general.architecture) and by the runtime (config.json `architectures`).

All share the Llama decoder layer (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP), which is what the runtime's
forward and the EAGLE-3 draft layer implement; they differ in what the config switches on:
- Qwen2: q/k/v biases always, tied or untied embeddings, its own RoPE base;
- Mistral: Llama's layout plus an optional sliding attention window, which the runtime does not implement: a model
  whose window is shorter than its context is refused (Mistral-7B-v0.1's 4096 of 32768), one without a window
  (v0.2 and later) runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle_trt.errors import CheckpointError


@dataclass(frozen=True)
class Family:
    model_type: str  # HF config model_type, GGUF general.architecture
    hf_class: str  # HF config architectures[0]
    label: str  # what users read
    attention_bias: bool  # q/k/v biases when the config does not say


FAMILIES = (
    Family("llama", "LlamaForCausalLM", "Llama (incl. SmolLM2)", False),
    Family("qwen2", "Qwen2ForCausalLM", "Qwen2 / Qwen2.5", True),
    Family("mistral", "MistralForCausalLM", "Mistral (no sliding window)", False),
)
BY_TYPE = {f.model_type: f for f in FAMILIES}
BY_CLASS = {f.hf_class: f for f in FAMILIES}


def supported_labels() -> str:
    return ", ".join(f.label for f in FAMILIES)


def family_of_type(model_type: str, source) -> Family:
    """The family of a model_type (convert's check), or a CheckpointError naming what is supported."""
    if model_type not in BY_TYPE:
        raise CheckpointError(f"unsupported architecture {model_type!r} in {source}; eagle-trt converts "
                              f"{supported_labels()} models")
    return BY_TYPE[model_type]


def family_of_config(cfg: dict, source) -> Family:
    """The family a config.json declares (the runtime's check), its sliding window checked."""
    arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
    if arch not in BY_CLASS:
        raise CheckpointError(f"{source}: architecture '{arch}' is not supported by the torch engine (supported: "
                              f"{', '.join(BY_CLASS)})")
    check_window(cfg, source)
    return BY_CLASS[arch]


def check_window(cfg: dict, source) -> None:
    """Refuse a sliding attention window shorter than the context: the runtime attends to every earlier token, which
    would give other outputs than the model's own."""
    window = cfg.get("sliding_window")
    use = cfg.get("use_sliding_window", True)
    positions = int(cfg.get("max_position_embeddings", 2048))
    if use and isinstance(window, int) and 0 < window < positions:
        raise CheckpointError(f"{source}: sliding_window {window} is shorter than max_position_embeddings "
                              f"{positions}; eagle-trt attends to the whole context and would not reproduce this "
                              "model (use a release without a sliding window)")
