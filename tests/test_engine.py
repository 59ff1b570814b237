"""Engine build: layout, hashes, determinism, dtype cast, checkpoint checks (opening one: test_engine_open.py).
Tiny model, CPU, fast."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_trt.config import EagleArchitecture, EagleConfig, load_config
from eagle_trt.engine import build_engine, read_manifest, sha256_file
from eagle_trt.errors import CheckpointError, ConfigError, InputError
from engine_support import (AUX, DRAFT_VOCAB, H, HD, HEADS, INTER, KV, base_ckpt, cfg, ckpt,  # noqa: F401
                            draft_config, draft_tensors, engine, kv_scales)


def test_build_layout_and_manifest(cfg, ckpt, tmp_path):
    summary = build_engine(cfg, ckpt, tmp_path / "out" / "tiny")
    root = tmp_path / "out" / "tiny"
    assert summary.engine_dir == root and summary.validated and summary.message.startswith(f"built '{root}'")
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert files == [
        "draft/config.json", "draft/model.safetensors", "eagle_config.yaml", "manifest.json",
        "target/config.json", "target/generation_config.json", "target/model.safetensors",
        "tokenizer/chat_template.jinja", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
    ]  # fmt: skip
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["tiny"]  # temp dir renamed away
    assert root.stat().st_mode & 0o777 == 0o755  # not mkdtemp's private 0700
    m = json.loads((root / "manifest.json").read_text())
    assert set(m) == {"format_version", "name", "backend", "created_by", "dtype", "weights", "draft_weights",
                      "block_compute", "kv_cache_dtype", "tree_limits", "io_limits", "target", "draft", "files"}  # fmt: skip
    assert (m["weights"], m["draft_weights"], m["block_compute"]) == ("float", "float", "float")
    assert m["target"] == {"architecture": "LlamaForCausalLM", "hidden_size": 64, "num_layers": 8, "vocab_size": 260}
    assert m["draft"] == {"kind": "eagle3", "hidden_size": 64, "draft_vocab_size": 32, "aux_layer_ids": AUX}
    assert m["tree_limits"]["draft_length"] == 4 and m["io_limits"]["max_input_len"] == 512
    assert m["kv_cache_dtype"] == "float32" and set(m["created_by"]) >= {"torch", "python", "eagle_trt"}
    assert set(m["files"]) == set(files) - {"manifest.json"} == set(summary.files)
    for rel, entry in m["files"].items():
        assert entry == {"sha256": sha256_file(root / rel), "bytes": (root / rel).stat().st_size}
    resolved = load_config(root / "eagle_config.yaml")
    # A deployable artifact: no path of the build machine in it (the checkpoint's included).
    assert resolved.checkpoint_dir is None and resolved.kv_cache_dtype == "float32"
    assert not [p for p in root.rglob("*") if p.is_file() and str(ckpt).encode() in p.read_bytes()]
    assert resolved.eagle_architecture == EagleArchitecture(
        hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=1, max_position_embeddings=1024
    )


def test_dry_run_writes_nothing(cfg, ckpt, tmp_path):
    summary = build_engine(cfg, ckpt, tmp_path / "out" / "tiny", dry_run=True)
    assert summary.validated and summary.files == {} and "nothing written" in summary.message
    assert not (tmp_path / "out").exists()


def test_two_builds_are_byte_identical(cfg, ckpt, tmp_path):
    a = read_manifest(build_engine(cfg, ckpt, tmp_path / "a").engine_dir).files
    b = read_manifest(build_engine(cfg, ckpt, tmp_path / "b").engine_dir).files
    assert a == b


def test_rebuild_replaces_old_engine(cfg, ckpt, engine):
    (engine / "stale.txt").write_text("old")
    build_engine(cfg, ckpt, engine)
    assert not (engine / "stale.txt").exists()
    assert [p.name for p in engine.parent.iterdir()] == ["tiny"]
    with pytest.raises(InputError) as info:
        build_engine(cfg, ckpt, engine, overwrite=False)
    assert str(info.value) == f"engine dir '{engine}' already exists; remove it or allow overwriting"


def test_float16_casts_floats_only(cfg, ckpt, tmp_path):
    root = build_engine(cfg.model_copy(update={"dtype": "float16"}), ckpt, tmp_path / "fp16").engine_dir
    with safe_open(str(root / "draft" / "model.safetensors"), "pt") as fh:
        assert fh.get_tensor("fc.weight").dtype == torch.float16
        assert fh.get_tensor("d2t").dtype == torch.int64
        assert fh.metadata() == {"format": "pt"}
    with safe_open(str(root / "target" / "model.safetensors"), "pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.float16}
    assert json.loads((root / "target" / "config.json").read_text())["dtype"] == "float16"
    assert read_manifest(root).kv_cache_dtype == "float16"


def test_official_midlayer_names_are_kept(cfg, ckpt, tmp_path):
    # The runtime tells official heads from modelopt ones by these names, so they must survive.
    save_file(draft_tensors(official=True), str(ckpt / "draft" / "model.safetensors"))
    root = build_engine(cfg, ckpt, tmp_path / "e").engine_dir
    with safe_open(str(root / "draft" / "model.safetensors"), "pt") as fh:
        assert "midlayer.hidden_norm.weight" in fh.keys()


def test_flat_aux_ids_win_and_reach_engine(cfg, ckpt, tmp_path):
    (ckpt / "draft" / "config.json").write_text(json.dumps(draft_config(eagle_aux_hidden_state_layer_ids=[2, 5, 6])))
    root = build_engine(cfg, ckpt, tmp_path / "e").engine_dir
    draft = json.loads((root / "draft" / "config.json").read_text())
    assert draft["eagle_aux_hidden_state_layer_ids"] == [2, 5, 6] == draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert read_manifest(root).draft.aux_layer_ids == [2, 5, 6]


def test_d2t_out_of_range(cfg, ckpt, tmp_path):
    tensors = draft_tensors()
    tensors["d2t"] = torch.full((DRAFT_VOCAB,), 300, dtype=torch.int64)
    save_file(tensors, str(ckpt / "draft" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"d2t\[0\] = 300 maps draft id 0 to target id 300, outside the target "
                       r"vocab \[0, 260\)"):
        build_engine(cfg, ckpt, tmp_path / "e", dry_run=True)


def test_failed_build_keeps_old_engine_and_leaves_no_temp(cfg, ckpt, engine, monkeypatch):
    import eagle_trt.engine.builder as builder

    before = read_manifest(engine)

    def broken(cfg, plan, root, max_shard_bytes):
        (root / "half-written").write_text("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(builder, "_write_engine", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        build_engine(cfg, ckpt, engine)
    assert [p.name for p in engine.parent.iterdir()] == ["tiny"]
    assert read_manifest(engine) == before


def test_refuses_to_replace_a_non_engine_dir(cfg, ckpt, tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("mine")
    with pytest.raises(InputError) as info:
        build_engine(cfg, ckpt, tmp_path / "stuff")
    assert str(info.value) == f"refusing to replace '{tmp_path / 'stuff'}': it is not empty and has no manifest.json"


def test_head_hidden_size_mismatch(cfg, ckpt, tmp_path):
    (ckpt / "draft" / "config.json").write_text(json.dumps(draft_config(hidden_size=32)))
    with pytest.raises(CheckpointError) as info:
        build_engine(cfg, ckpt, tmp_path / "e")
    assert str(info.value) == (
        f"draft hidden_size (32) in '{ckpt / 'draft' / 'config.json'}' does not match the target "
        f"hidden_size (64) in '{ckpt / 'target' / 'config.json'}'"
    )
    assert not (tmp_path / "e").exists()


def test_head_tensor_shape_mismatch_names_file(cfg, ckpt, tmp_path):
    save_file(draft_tensors(hidden=32), str(ckpt / "draft" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model.safetensors': fc.weight has shape \[32, 96\], expected \[64, 192\]"):
        build_engine(cfg, ckpt, tmp_path / "e")


def test_config_architecture_mismatch(cfg, ckpt, tmp_path):
    arch = dict(hidden_size=576, num_attention_heads=4, intermediate_size=128, num_hidden_layers=1, max_position_embeddings=1024)
    bad = cfg.model_copy(update={"eagle_architecture": EagleArchitecture(**arch)})
    with pytest.raises(ConfigError) as info:
        build_engine(bad, ckpt, tmp_path / "e", dry_run=True)
    assert str(info.value) == (
        f"eagle_architecture.hidden_size (576) does not match hidden_size (64) of the target in '{ckpt / 'target' / 'config.json'}'"
    )
    bad = cfg.model_copy(update={"eagle_architecture": EagleArchitecture(**{**arch, "hidden_size": 64, "num_attention_heads": 9})})
    with pytest.raises(ConfigError, match=r"^eagle_architecture.num_attention_heads \(9\) does not match num_attention_heads \(4\) in '"):
        build_engine(bad, ckpt, tmp_path / "e", dry_run=True)


def test_io_limits_must_fit_target(ckpt, tmp_path):
    with pytest.raises(ConfigError, match=r"^max_input_len \(2048\) \+ max_output_len \(512\) = 2560 exceeds max_position_embeddings \(1024\)"):
        build_engine(EagleConfig(), ckpt, tmp_path / "e", dry_run=True)


def test_missing_checkpoint(cfg, tmp_path):
    with pytest.raises(CheckpointError) as info:
        build_engine(cfg, tmp_path / "nope", tmp_path / "e")
    assert str(info.value) == f"checkpoint dir '{tmp_path / 'nope'}' not found"
    with pytest.raises(InputError, match="^no checkpoint dir: set checkpoint_dir in the config or pass --checkpoint$"):
        build_engine(cfg, None, tmp_path / "e")


def test_missing_draft_weights(cfg, ckpt, tmp_path):
    (ckpt / "draft" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"^draft weights '.*draft/model.safetensors' not found$"):
        build_engine(cfg, ckpt, tmp_path / "e")


def test_kv_scales_copied_and_listed(cfg, ckpt, tmp_path):
    save_file(kv_scales(), str(ckpt / "kv_scales.safetensors"))
    root = build_engine(cfg.model_copy(update={"kv_cache_dtype": "fp8"}), ckpt, tmp_path / "e").engine_dir
    assert (root / "kv_scales.safetensors").read_bytes() == (ckpt / "kv_scales.safetensors").read_bytes()
    m = read_manifest(root)
    assert "kv_scales.safetensors" in m.files and m.kv_cache_dtype == "fp8"


def test_kv_scales_absent_is_fine(cfg, ckpt, tmp_path):
    root = build_engine(cfg.model_copy(update={"kv_cache_dtype": "fp8"}), ckpt, tmp_path / "e").engine_dir
    assert not (root / "kv_scales.safetensors").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"target.k_scales": torch.ones(3)}, r"target.k_scales is float32\[3\], expected float32\[8\]$"),
        ({"draft.v_scales": torch.ones(1, dtype=torch.float16)}, r"draft.v_scales is float16\[1\], expected float32\[1\]$"),
        ({"target.v_scales": torch.zeros(8)}, r"target.v_scales must be finite and > 0$"),
        ({"extra": torch.ones(1)}, r"must hold exactly \['draft.k_scales'"),
    ],
)
def test_bad_kv_scales(cfg, ckpt, tmp_path, change, message):
    save_file({**kv_scales(), **change}, str(ckpt / "kv_scales.safetensors"))
    with pytest.raises(CheckpointError, match=message):
        build_engine(cfg, ckpt, tmp_path / "e", dry_run=True)


def eagle1_tensors() -> dict[str, torch.Tensor]:
    """A random EAGLE-1/2 head: fc over [embedding ; hidden], one plain Llama layer without input_layernorm."""
    g = torch.Generator().manual_seed(1)
    shapes = {
        "fc.weight": [H, 2 * H], "fc.bias": [H],
        "layers.0.self_attn.q_proj.weight": [HEADS * HD, H], "layers.0.self_attn.k_proj.weight": [KV * HD, H],
        "layers.0.self_attn.v_proj.weight": [KV * HD, H], "layers.0.self_attn.o_proj.weight": [H, HEADS * HD],
        "layers.0.mlp.gate_proj.weight": [INTER, H], "layers.0.mlp.up_proj.weight": [INTER, H],
        "layers.0.mlp.down_proj.weight": [H, INTER], "layers.0.post_attention_layernorm.weight": [H],
    }  # fmt: skip
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def test_eagle1_head_needs_trtllm(cfg, ckpt, tmp_path):
    save_file(eagle1_tensors(), str(ckpt / "draft" / "model.safetensors"))
    (ckpt / "draft" / "config.json").write_text(json.dumps(draft_config(draft_vocab_size=260)))
    with pytest.raises(CheckpointError, match=r"is an EAGLE-1/2 head \(fc.weight \[64, 128\], no hidden_norm\); "
                       r"the torch backend runs EAGLE-3 heads only$") as info:
        build_engine(cfg, ckpt, tmp_path / "e", dry_run=True)
    assert "--backend trtllm" in info.value.hint
    trt = cfg.model_copy(update={"backend": "trtllm", "dtype": "float16", "trtllm_version": "1.2"})
    assert build_engine(trt, ckpt, tmp_path / "e", dry_run=True).head == "eagle1"


def test_fp8_kv_allowed_on_torch(cfg, ckpt, tmp_path):
    summary = build_engine(cfg.model_copy(update={"kv_cache_dtype": "fp8"}), ckpt, tmp_path / "e", dry_run=True)
    assert summary.kv_cache_dtype == "fp8" and summary.backend == "torch"


def test_trtllm_rejects_float32(cfg, ckpt, tmp_path):
    with pytest.raises(ConfigError, match=r"^dtype float32 is not supported by backend trtllm \(use float16 or bfloat16\)$"):
        build_engine(cfg.model_copy(update={"backend": "trtllm"}), ckpt, tmp_path / "e", dry_run=True)
