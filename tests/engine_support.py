"""The tiny checkpoint and engine the engine tests share: a random EAGLE-3 head over the tiny target."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle_trt.config import EagleConfig
from eagle_trt.engine import build_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_tiny_model import make_tiny_model  # noqa: E402

H, HEADS, KV, HD, INTER, AUX, DRAFT_VOCAB = 64, 4, 2, 16, 128, [1, 3, 4], 32


def draft_tensors(hidden: int = H, official: bool = False) -> dict[str, torch.Tensor]:
    """A random EAGLE-3 head with modelopt names (or official midlayer.* names)."""
    g = torch.Generator().manual_seed(0)
    layer = {
        "self_attn.q_proj.weight": [HEADS * HD, 2 * hidden],
        "self_attn.k_proj.weight": [KV * HD, 2 * hidden],
        "self_attn.v_proj.weight": [KV * HD, 2 * hidden],
        "self_attn.o_proj.weight": [hidden, HEADS * HD],
        "mlp.gate_proj.weight": [INTER, hidden],
        "mlp.up_proj.weight": [INTER, hidden],
        "mlp.down_proj.weight": [hidden, INTER],
        "input_layernorm.weight": [hidden],
        "hidden_norm.weight": [hidden],
        "post_attention_layernorm.weight": [hidden],
    }
    prefix = "midlayer." if official else "layers.0."
    shapes = {prefix + k: s for k, s in layer.items()}
    shapes.update({"fc.weight": [hidden, len(AUX) * hidden], "norm.weight": [hidden], "lm_head.weight": [DRAFT_VOCAB, hidden]})
    out = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    out["d2t"] = torch.arange(DRAFT_VOCAB, dtype=torch.int64)  # draft id i -> target id 2*i
    return out


def draft_config(**changes) -> dict:
    cfg = dict(
        architectures=["LlamaForCausalLMEagle3"], hidden_size=H, num_attention_heads=HEADS,
        num_key_value_heads=KV, head_dim=HD, intermediate_size=INTER, num_hidden_layers=1,
        draft_vocab_size=DRAFT_VOCAB, vocab_size=260,
        eagle_config={"eagle_aux_hidden_state_layer_ids": AUX, "use_aux_hidden_state": True},
    )  # fmt: skip
    return {**cfg, **changes}


def kv_scales(layers: int = 8) -> dict[str, torch.Tensor]:
    return {"target.k_scales": torch.full((layers,), 0.02), "target.v_scales": torch.full((layers,), 0.03),
            "draft.k_scales": torch.full((1,), 0.05), "draft.v_scales": torch.full((1,), 0.04)}  # fmt: skip


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory) -> Path:
    ckpt = tmp_path_factory.mktemp("base") / "ckpt"
    make_tiny_model(ckpt / "target")
    (ckpt / "draft").mkdir()
    save_file(draft_tensors(), str(ckpt / "draft" / "model.safetensors"))
    (ckpt / "draft" / "config.json").write_text(json.dumps(draft_config()))
    (ckpt / "convert.json").write_text("{}")
    return ckpt


@pytest.fixture
def ckpt(base_ckpt, tmp_path) -> Path:
    return Path(shutil.copytree(base_ckpt, tmp_path / "ckpt"))


@pytest.fixture
def cfg() -> EagleConfig:
    # The tiny target has 1024 positions, so the SmolLM2 defaults (2048 + 512) would not fit.
    return EagleConfig(name="tiny", dtype="float32", max_input_len=512, max_output_len=256, draft_length=4,
                       total_tokens=16, beam_width=4)


@pytest.fixture
def engine(cfg, ckpt, tmp_path) -> Path:
    return build_engine(cfg, ckpt, tmp_path / "engines" / "tiny").engine_dir
