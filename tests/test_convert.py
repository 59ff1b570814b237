"""Tests for eagle_trt.convert on the tiny random Llama (scripts/make_tiny_model.py); < 1 min on CPU.

    .venv/bin/python -m pytest tests/test_convert.py -q
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_tiny_model import TINY_CONFIG, make_tiny_model  # noqa: E402

from eagle_trt.convert import ConvertResult, convert_model  # noqa: E402
from eagle_trt.convert.attach import attach_eagle3  # noqa: E402
from eagle_trt.convert.load_target import load_target  # noqa: E402
from eagle_trt.errors import CheckpointError, InputError  # noqa: E402

H = TINY_CONFIG["hidden_size"]
V = TINY_CONFIG["vocab_size"]
I = TINY_CONFIG["intermediate_size"]  # noqa: E741
HD = TINY_CONFIG["head_dim"]
NH, NKV = TINY_CONFIG["num_attention_heads"], TINY_CONFIG["num_key_value_heads"]
# Not modelopt's default (10000): proves the draft takes the target's rope_theta.
ROPE_THETA = 50000.0
AUX_IDS = [1, 3, 4]  # sorted({1, 8 // 2 - 1, 8 - 4}) for the 8-layer tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("src") / "tiny", rope_theta=ROPE_THETA)


@pytest.fixture(scope="module")
def ckpt(tiny, tmp_path_factory) -> ConvertResult:
    return convert_model(tiny, tmp_path_factory.mktemp("out") / "ckpt", steps=0, progress=False)


def test_layout(ckpt):
    out = ckpt.output_dir
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"convert.json", "draft/config.json", "draft/model.safetensors"} <= files
    assert {"target/config.json", "target/model.safetensors", "target/tokenizer.json",
            "target/tokenizer_config.json", "target/generation_config.json"} <= files
    assert all(f.startswith(("target/", "draft/")) or f in ("convert.json", "kv_scales.safetensors")
               for f in files), files
    assert set(p.name for p in (out / "draft").iterdir()) == {"config.json", "model.safetensors"}
    # the staging dir was renamed, not left behind
    assert [p.name for p in out.parent.iterdir()] == [out.name]
    assert (ckpt.target_dir, ckpt.draft_dir) == (out / "target", out / "draft")


def test_draft_keys_and_shapes(ckpt):
    sd = load_file(ckpt.draft_dir / "model.safetensors")
    expected = {
        "fc.weight": (H, len(AUX_IDS) * H),
        "layers.0.self_attn.q_proj.weight": (NH * HD, 2 * H),  # input is cat(embeds, hidden)
        "layers.0.self_attn.k_proj.weight": (NKV * HD, 2 * H),
        "layers.0.self_attn.v_proj.weight": (NKV * HD, 2 * H),
        "layers.0.self_attn.o_proj.weight": (H, NH * HD),
        "layers.0.mlp.gate_proj.weight": (I, H),
        "layers.0.mlp.up_proj.weight": (I, H),
        "layers.0.mlp.down_proj.weight": (H, I),
        "layers.0.hidden_norm.weight": (H,),
        "layers.0.input_layernorm.weight": (H,),
        "layers.0.post_attention_layernorm.weight": (H,),
        "norm.weight": (H,),
        # full draft vocab: modelopt exports a copy of the target's lm_head, and no d2t
        "lm_head.weight": (V, H),
    }
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected
    assert all(v.dtype == torch.float32 for v in sd.values())
    target = load_file(ckpt.target_dir / "model.safetensors")
    assert torch.equal(sd["lm_head.weight"], target["lm_head.weight"])
    assert not any("eagle" in k for k in target)


def test_draft_config(ckpt):
    cfg = json.loads((ckpt.draft_dir / "config.json").read_text())
    assert cfg["rope_theta"] == ROPE_THETA
    assert cfg["rope_scaling"]["rope_theta"] == ROPE_THETA
    assert cfg["rope_scaling"]["rope_type"] == "default"  # no YaRN injected by modelopt
    expected = dict(hidden_size=H, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
                    intermediate_size=I, rms_norm_eps=TINY_CONFIG["rms_norm_eps"],
                    max_position_embeddings=TINY_CONFIG["max_position_embeddings"], vocab_size=V,
                    draft_vocab_size=V, eagle_aux_hidden_state_layer_ids=AUX_IDS,
                    num_hidden_layers=1, target_hidden_size=H, bos_token_id=256, eos_token_id=257)
    assert {k: cfg.get(k) for k in expected} == expected
    assert cfg["torch_dtype"] == "float32"


def test_manifest(ckpt):
    m = json.loads((ckpt.output_dir / "convert.json").read_text())
    assert m["source"]["format"] == "hf" and m["source"]["architecture"] == "llama"
    assert Path(m["source"]["path"]).name == "tiny"
    assert m["steps"] == 0 and m["aux_layer_ids"] == AUX_IDS and m["draft_vocab_size"] == V
    assert set(m["versions"]) == {"eagle_trt", "torch", "transformers", "modelopt"}
    assert all(m["versions"].values())
    json.dumps(ckpt.summary)  # --json ready
    assert ckpt.summary["draft_dir"] == str(ckpt.draft_dir)


def test_target_reloads_and_generates_like_source(tiny, ckpt):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(dtype=torch.float32, local_files_only=True)
    src = AutoModelForCausalLM.from_pretrained(tiny, **kw).eval()
    tgt = AutoModelForCausalLM.from_pretrained(ckpt.target_dir, **kw).eval()
    assert type(tgt).__name__ == "LlamaForCausalLM"
    tok = AutoTokenizer.from_pretrained(ckpt.target_dir, local_files_only=True)
    ids = tok("hello world", return_tensors="pt").input_ids
    gen = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(src.generate(ids, **gen), tgt.generate(ids, **gen))


def test_head_init_is_seeded_and_runs(tiny, ckpt):
    heads = []
    for _ in range(2):
        model, _, _ = load_target(tiny)
        torch.manual_seed(123)
        model = attach_eagle3(model)
        after_attach = torch.rand(3)
        torch.manual_seed(123)
        assert torch.equal(after_attach, torch.rand(3))  # the caller's RNG stream is untouched
        heads.append(model.eagle_module.state_dict())
    # the attached head is usable: modelopt's own draft loop runs on it
    base_token, draft = model.pseudo_speculative_generate(torch.tensor([[256, 104, 105]]), steps=2)
    assert base_token.shape == (1, 1) and draft.shape == (1, 2)
    exported = load_file(ckpt.draft_dir / "model.safetensors")
    for key, value in heads[0].items():
        assert torch.equal(value, heads[1][key]), key
        assert torch.equal(value, exported[key]), key


def test_reduced_draft_vocab(tiny, tmp_path):
    result = convert_model(tiny, tmp_path / "ckpt", draft_vocab_size=100, progress=False)
    sd = load_file(result.draft_dir / "model.safetensors")
    assert tuple(sd["lm_head.weight"].shape) == (100, H)
    assert tuple(sd["d2t"].shape) == (100,) and sd["d2t"].dtype == torch.int64
    cfg = json.loads((result.draft_dir / "config.json").read_text())
    assert (cfg["draft_vocab_size"], cfg["vocab_size"]) == (100, V)
    assert result.summary["draft_vocab_size"] == 100


@pytest.mark.parametrize("size", [0, V + 1])
def test_bad_draft_vocab(tiny, tmp_path, size):
    with pytest.raises(InputError, match="draft"):
        convert_model(tiny, tmp_path / "ckpt", draft_vocab_size=size, progress=False)
    assert not (tmp_path / "ckpt").exists()


def test_fp8_kv_scales_are_calibrated(ckpt):
    from safetensors.torch import load_file as _load

    scales = _load(str(ckpt.output_dir / "kv_scales.safetensors"))
    assert scales["target.k_scales"].shape == (TINY_CONFIG["num_hidden_layers"],)
    assert scales["draft.v_scales"].shape == (1,) and (scales["target.v_scales"] > 0).all()
    cal = json.loads((ckpt.output_dir / "convert.json").read_text())["kv_calibration"]
    fp8 = cal["fp8_vs_fp32"]
    assert fp8["eagle_equals_ar_on_fp8"] is True
    assert fp8["kv_bytes_per_token_fp8"] * 4 == fp8["kv_bytes_per_token_fp32"]
    # FP8 KV is lossy against fp32 KV (3 mantissa bits); on this tiny model it keeps most greedy tokens.
    assert fp8["greedy_token_agreement"] >= 0.5


def test_training_needs_data(tiny, tmp_path):
    with pytest.raises(InputError, match="needs --data"):
        convert_model(tiny, tmp_path / "ckpt", steps=10, progress=False)


def test_ship_a_trained_head(tiny, tmp_path):
    first = convert_model(tiny, tmp_path / "a", progress=False)
    second = convert_model(tiny, tmp_path / "b", head=first.draft_dir, progress=False)
    assert (second.draft_dir / "model.safetensors").read_bytes() == (first.draft_dir / "model.safetensors").read_bytes()
    assert second.summary["head_source"] == str(first.draft_dir)
    assert not (second.draft_dir / "datastore.safetensors").exists()  # none to copy
    from eagle_trt.engine.datastore_file import write_datastore

    write_datastore(first.draft_dir / "datastore.safetensors", [[1, 2, 3]])
    third = convert_model(tiny, tmp_path / "c", head=first.draft_dir, progress=False)
    assert (third.draft_dir / "datastore.safetensors").read_bytes() == (
        first.draft_dir / "datastore.safetensors").read_bytes()


def test_head_that_does_not_fit_is_refused(tiny, tmp_path):
    import json as _json

    head = convert_model(tiny, tmp_path / "a", progress=False).draft_dir
    cfg = _json.loads((head / "config.json").read_text())
    cfg["hidden_size"] = 32
    (head / "config.json").write_text(_json.dumps(cfg))
    with pytest.raises(CheckpointError, match="hidden_size"):
        convert_model(tiny, tmp_path / "b", head=head, progress=False)
    assert not (tmp_path / "b").exists()


def test_missing_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(InputError, match="not found") as e:
        convert_model(missing, tmp_path / "ckpt", progress=False)
    assert str(missing) in str(e.value)


def test_not_a_model(tmp_path):
    f = tmp_path / "weights.txt"
    f.write_text("x")
    with pytest.raises(InputError, match="not a model directory or .gguf"):
        load_target(f)


def _copy(tiny: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copytree(tiny, dst, ignore=lambda _d, names: [n for n in names if n in skip])
    return dst


def test_truncated_safetensors(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "bad")
    weights = bad / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated") as e:
        load_target(bad)
    assert str(weights) in str(e.value)


def test_pickle_only_dir_refused(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "bin", skip=("model.safetensors",))
    (bad / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(CheckpointError, match="pytorch_model.bin.*safetensors") as e:
        load_target(bad)
    assert str(bad) in str(e.value)


def test_missing_tokenizer(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "notok", skip=("tokenizer.json",))
    with pytest.raises(CheckpointError, match="no tokenizer") as e:
        load_target(bad)
    assert str(bad) in str(e.value)


def test_unsupported_architecture(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "gpt2")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="unsupported architecture 'gpt2'"):
        load_target(bad)


def _write_gguf(path: Path, arch: str) -> Path:
    """A small but valid GGUF file (one tensor); enough for the header checks."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_unsupported_architecture(tmp_path):
    with pytest.raises(CheckpointError, match="unsupported architecture 'gpt2'"):
        load_target(_write_gguf(tmp_path / "m.gguf", "gpt2"))


def test_truncated_gguf(tmp_path):
    path = _write_gguf(tmp_path / "m.gguf", "llama")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated GGUF") as e:
        load_target(path)
    assert str(path) in str(e.value)


def test_existing_output_needs_force(tiny, tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(InputError, match="--force") as e:
        convert_model(tiny, out, progress=False)
    assert str(out) in str(e.value)
    assert (out / "keep.txt").read_text() == "precious"
    convert_model(tiny, out, overwrite=True, progress=False)
    assert not (out / "keep.txt").exists() and (out / "draft" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_failure_leaves_no_partial_output(tiny, tmp_path, monkeypatch):
    import eagle_trt.convert.head_training as head_training

    def boom(*args, **kwargs):
        raise RuntimeError("export failed")

    monkeypatch.setattr(head_training, "write_draft", boom)
    with pytest.raises(RuntimeError, match="export failed"):
        convert_model(tiny, tmp_path / "ckpt", progress=False)
    assert list(tmp_path.iterdir()) == []

    old = tmp_path / "old"
    old.mkdir()
    (old / "keep.txt").write_text("previous checkpoint")
    with pytest.raises(RuntimeError, match="export failed"):
        convert_model(tiny, old, overwrite=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    assert (old / "keep.txt").read_text() == "previous checkpoint"


def test_convert_lets_go_of_the_loaded_model(tiny, tmp_path):
    """The HF model convert loaded is freed once the checkpoint is written, before calibration loads its own copy
    (a real model would otherwise be held twice). In a fresh interpreter: the first import of modelopt is what used
    to keep it alive."""
    import subprocess
    import sys

    code = f"""
import gc, weakref
import eagle_trt.convert.pipeline as pipeline
seen, real_load, real_calibrate = [], pipeline.load_target, pipeline._calibrate
def load(path):
    model, tok, info = real_load(path)
    seen.append(weakref.ref(model))
    return model, tok, info
def calibrate(*a, **k):
    gc.collect()
    assert seen and seen[0]() is None, "the loaded model is still alive during calibration"
    return real_calibrate(*a, **k)
pipeline.load_target, pipeline._calibrate = load, calibrate
pipeline.convert_model({str(tiny)!r}, {str(tmp_path / "ckpt")!r}, progress=False)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
