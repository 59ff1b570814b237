"""Model shapes read from HF `config.json` files (target) and EAGLE-3 draft configs.

    spec = TargetSpec.from_hf_config(json.load(open("engines/x/target/config.json")))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle_trt.architectures import family_of_config
from eagle_trt.errors import CheckpointError



def _rope(cfg: dict) -> tuple[float, dict | None]:
    # transformers 5 keeps rope_theta inside rope_parameters/rope_scaling; 4.x at the top level.
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or None
    theta = cfg.get("rope_theta")
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
    """Shapes of a Llama-family target (Llama, SmolLM2, Mistral, Qwen2)."""

    architecture: str
    vocab_size: int
    num_layers: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: list[int] = field(default_factory=list)

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
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases; Llama only when attention_bias is set.
                attention_bias=bool(cfg.get("attention_bias", family.attention_bias)),
                eos_token_ids=_eos_ids(cfg),
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
