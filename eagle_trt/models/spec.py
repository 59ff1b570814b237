"""Model shapes read from HF `config.json` files (target) and EAGLE-3 draft configs.

    spec = TargetSpec.from_hf_config(json.load(open("engines/x/target/config.json")))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle_trt.architectures import check_rope, family_of_config
from eagle_trt.errors import CheckpointError



def _rope(cfg: dict, layer_type: str = "full_attention") -> tuple[float, dict | None]:
    """(base, scaling or None) of the layers of this type. transformers 5 keeps rope_theta inside rope_parameters
    (one dict per layer type for Gemma 3), 4.x at the top level with rope_scaling (Gemma 3's local layers:
    rope_local_base_freq, unscaled). `architectures.check_config` has refused the types the runtime lacks."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or None
    if scaling and all(isinstance(v, dict) for v in scaling.values()):
        scaling = scaling.get(layer_type)
    theta = cfg.get("rope_theta")
    if layer_type == "sliding_attention" and cfg.get("rope_local_base_freq") is not None:
        theta, scaling = cfg["rope_local_base_freq"], None
    if theta is None and scaling:
        theta = scaling.get("rope_theta")
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return float(theta if theta is not None else 10000.0), scaling


def _layer_shape(cfg: dict) -> dict:
    """Fields a target layer and a draft layer read the same way from an HF-style config."""
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    theta, scaling = _rope(cfg)
    return dict(
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
    )


def _gemma_fields(cfg: dict, source: str) -> dict:
    """Gemma 3's layer features from its config (transformers 4.x and 5.x spellings)."""
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:  # 4.x configs before layer_types: every `sliding_window_pattern`-th layer is global
        pattern = int(cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6)))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise CheckpointError(f"{source}: layer_types must list sliding_attention / full_attention for each of the "
                              f"{layers} layers")
    if cfg.get("use_bidirectional_attention"):
        raise CheckpointError(f"{source}: use_bidirectional_attention is not supported (a causal LM is needed)")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(f"{source}: hidden_activation {act!r} is not supported (gelu_pytorch_tanh is)")
    local = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    window = cfg.get("sliding_window")
    if local and not (isinstance(window, int) and window > 0):
        raise CheckpointError(f"{source}: sliding_window must be a positive integer for its sliding layers")
    cap = cfg.get("final_logit_softcapping")
    return dict(sandwich_norms=True, norm_plus_one=True, activation="gelu_tanh",
                embed_scale=float(cfg["hidden_size"]) ** 0.5,
                attention_scale=float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
                sliding_window=int(window) if local else None, local_layers=local,
                rope_local_theta=_rope(cfg, "sliding_attention")[0],
                final_logit_softcapping=float(cap) if cap else None)


def _eos_ids(cfg: dict) -> list[int]:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


@dataclass(frozen=True)
class LayerShape:
    """What one decoder layer needs, read the same way for targets and draft heads (`_layer_shape`)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None


@dataclass(frozen=True)
class TargetSpec(LayerShape):
    """Shapes of a target (architectures.py: Llama, SmolLM2, Mistral, Qwen2, Qwen3, Gemma 3) and the layer features
    its family switches on."""

    architecture: str
    vocab_size: int
    num_layers: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: list[int] = field(default_factory=list)
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE
    sandwich_norms: bool = False  # Gemma 3: RMSNorm on the attention and MLP outputs before the residual adds
    norm_plus_one: bool = False  # Gemma 3: the norms scale by (1 + w); the loader adds the 1
    activation: str = "silu"  # the gated MLP's: silu, or gelu_tanh (Gemma 3's gelu_pytorch_tanh)
    embed_scale: float | None = None  # token embeddings times this (Gemma 3: sqrt(hidden))
    attention_scale: float | None = None  # scores times this; None: head_dim^-0.5
    sliding_window: int | None = None  # a local layer's query at p sees keys at positions > p - window
    local_layers: tuple[int, ...] = ()  # the sliding-window layers (Gemma 3's layer_types)
    rope_local_theta: float = 10000.0  # the local layers' RoPE base (unscaled)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)

    @classmethod
    def from_hf_config(cls, cfg: dict, source: str = "config.json") -> "TargetSpec":
        family = family_of_config(cfg, source)
        arch = family.hf_class
        try:
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                **_layer_shape(cfg),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", family.gemma)),
                # Qwen2 always has q/k/v biases; Llama only when attention_bias is set.
                attention_bias=bool(cfg.get("attention_bias", family.attention_bias)),
                eos_token_ids=_eos_ids(cfg),
                qk_norm=family.qk_norm,
                **(_gemma_fields(cfg, source) if family.gemma else {}),
            )
        except KeyError as e:
            raise CheckpointError(f"{source}: missing field {e.args[0]!r}") from None


@dataclass(frozen=True)
class DraftSpec(LayerShape):
    """Shapes of an EAGLE-3 draft head (one decoder layer over [embedding ; fused hidden])."""

    vocab_size: int  # target vocab
    draft_vocab_size: int
    aux_layer_ids: list[int]
    attention_bias: bool = False

    @classmethod
    def from_config(cls, cfg: dict, target: TargetSpec, source: str = "draft/config.json") -> "DraftSpec":
        check_rope(cfg, source)
        try:
            aux = cfg.get("eagle_aux_hidden_state_layer_ids")
            if not aux:
                eagle_cfg = cfg.get("eagle_config") or {}
                aux = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
            if not aux:
                n = target.num_layers
                aux = sorted({1, max(0, n // 2 - 1), max(0, n - 4)})
            return cls(
                **_layer_shape(cfg),
                vocab_size=int(cfg.get("vocab_size", target.vocab_size)),
                draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg.get("vocab_size", target.vocab_size)),
                aux_layer_ids=[int(a) for a in aux],
                attention_bias=bool(cfg.get("attention_bias", False)),
            )
        except KeyError as e:
            raise CheckpointError(f"{source}: missing field {e.args[0]!r}") from None
