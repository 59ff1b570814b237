"""TensorRT-LLM 1.2's legacy EAGLE-1/2 engine flow: a legacy head's bundle (its checkpoint config against the recorded
schema, its trtllm-build command) and its refusal on lines that no longer have that flow. No GPU, no tensorrt_llm."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_trt.engine import build_engine, trtllm_bundle
from eagle_trt.errors import ConfigError
from trtllm_fakes import SCHEMA, check_types, tiny_trtllm_checkpoint, trt_cfg


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory) -> Path:
    return tiny_trtllm_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("trt") / "ckpt")


def eagle1_ckpt(ckpt: Path, dest: Path) -> Path:
    work = Path(shutil.copytree(ckpt, dest))
    g = torch.Generator().manual_seed(3)
    h, heads, kv, hd, inter = 64, 4, 2, 16, 128
    shapes = {"fc.weight": [h, 2 * h], "layers.0.self_attn.q_proj.weight": [heads * hd, h],
              "layers.0.self_attn.k_proj.weight": [kv * hd, h], "layers.0.self_attn.v_proj.weight": [kv * hd, h],
              "layers.0.self_attn.o_proj.weight": [h, heads * hd], "layers.0.mlp.gate_proj.weight": [inter, h],
              "layers.0.mlp.up_proj.weight": [inter, h], "layers.0.mlp.down_proj.weight": [h, inter],
              "layers.0.post_attention_layernorm.weight": [h]}  # fmt: skip
    save_file({k: torch.randn(s, generator=g) for k, s in shapes.items()}, str(work / "draft" / "model.safetensors"))
    dcfg = json.loads((work / "draft" / "config.json").read_text())
    for key in ("eagle_aux_hidden_state_layer_ids", "draft_vocab_size"):
        dcfg.pop(key, None)
    (work / "draft" / "config.json").write_text(json.dumps(dcfg))
    return work


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_legacy_eagle_checkpoint_matches_schema(ckpt, tmp_path, kv):
    cfg = trt_cfg(kv_cache_dtype=kv, total_tokens=12, trtllm_version="1.2")
    summary = build_engine(cfg, eagle1_ckpt(ckpt, tmp_path / "ckpt"), tmp_path / "e")
    root = summary.engine_dir
    assert summary.head == "eagle1" and summary.trtllm["validated"] is False
    conf = json.loads((root / "legacy_trt" / "config.json").read_text())
    check_types(conf, SCHEMA["legacy_checkpoint"], "EagleForCausalLM", "legacy_trt/config.json")
    # Legacy names: max_draft_len is the whole tree, num_eagle_layers its depth.
    assert (conf["max_draft_len"], conf["num_eagle_layers"], conf["max_non_leaves_per_layer"]) == (12, 4, 4)
    assert (conf["num_hidden_layers"], conf["hidden_size"], conf["vocab_size"]) == (8, 64, 260)
    assert conf["eagle_net_config"]["num_hidden_layers"] == 1
    want = "FP8" if kv == "fp8" else None
    assert conf["quantization"]["kv_cache_quant_algo"] == conf["eagle_net_config"]["quantization"]["kv_cache_quant_algo"] == want
    assert not (root / "extra_llm_api_options.yaml").exists()  # the PyTorch backend runs EAGLE-3 only
    with safe_open(str(root / "draft" / "model.safetensors"), "pt") as fh:  # convert_checkpoint.py's own names
        assert any(k.startswith("layers.0.") for k in fh.keys())

    script = root / "legacy_trt" / "trtllm_build.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert script.stat().st_mode & 0o111 == 0o111
    build_line = next(line for line in script.read_text().splitlines() if line.startswith("trtllm-build "))
    assert build_line == " ".join(trtllm_bundle.trtllm_build_command(cfg))
    words = build_line.split()
    assert set(w for w in words if w.startswith("--")) <= set(SCHEMA["cli"]["trtllm-build"]["options"])
    assert words[words.index("--speculative_decoding_mode") + 1] == "eagle"
    assert words[words.index("--gemm_plugin") + 1] == "bfloat16"


def test_legacy_head_is_refused_for_lines_without_the_engine_flow(ckpt, tmp_path):
    work = eagle1_ckpt(ckpt, tmp_path / "ckpt")
    with pytest.raises(ConfigError, match=r"needs TensorRT-LLM's legacy TensorRT-engine flow, which TensorRT-LLM 1.3 "
                                          r'.* build it with trtllm_version "1.2" \(--trtllm-version 1.2\)'):
        build_engine(trt_cfg(total_tokens=12), work, tmp_path / "e", dry_run=True)
