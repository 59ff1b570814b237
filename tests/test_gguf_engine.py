"""A GGUF's own blocks through convert's keep step and build (`weights: auto`): the engine's projections are the
file's bytes (mixed formats in one fused projection included), the target computes the model transformers' GGUF
loader de-quantizes (up to fp32 summation order), and a verify row still equals decoding its token alone."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eagle_trt.convert.gguf_blocks import read_blocks
from eagle_trt.convert.keep_blocks import keep_blocks
from eagle_trt.engine.weight_copy import copy_weights
from eagle_trt.models import block_weights
from eagle_trt.models.llama import LlamaTarget, model_tensors
from eagle_trt.models.native.kernels import NativeKernels
from eagle_trt.models.reference import TorchKernels
from eagle_trt.models.spec import TargetSpec
from eagle_trt.models.weights import read_json
from native_support import build_names, lib_or_skip
from test_gemm import verify_equals_decode
from test_gguf_blocks import write_tiny_gguf


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def gguf_checkpoint(request, tmp_path_factory) -> tuple[Path, Path]:
    """(the GGUF, a checkpoint target dir: transformers' de-quantized model plus the kept blocks)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    root = tmp_path_factory.mktemp("gguf")
    path = write_tiny_gguf(root / "tiny.gguf", "llama", tied=request.param)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(root), gguf_file=path.name, dtype=torch.float32,
                                                              local_files_only=True)
    model.save_pretrained(root / "target")
    table = keep_blocks(path, root / "target")
    assert table["model.layers.0.self_attn.q_proj.weight"]["format"] == "q4_k"
    return path, root / "target"


def load(model_dir: Path, kernels) -> LlamaTarget:
    spec = TargetSpec.from_hf_config(read_json(model_dir / "config.json"))
    return LlamaTarget.from_state_dict(spec, model_tensors(model_dir, torch.float32), torch.float32, model_dir,
                                       kernels=kernels)


def engine_target(ckpt: Path, out: Path, weights: str) -> Path:
    out.mkdir()
    config = json.loads((ckpt / "config.json").read_text())
    table = copy_weights([ckpt / "model.safetensors"], out, "float32", 1 << 40, weights=weights,
                         tied=bool(config.get("tie_word_embeddings")))
    (out / "config.json").write_text(json.dumps(config))
    assert bool(table) == (weights == "auto")
    return out


def test_build_keeps_the_files_bytes(gguf_checkpoint, tmp_path):
    path, ckpt = gguf_checkpoint
    out = engine_target(ckpt, tmp_path / "target", "auto")
    table = block_weights.read_table(out)
    blocks = read_blocks(path)
    assert {e["format"] for e in table.values()} >= {"q4_k", "q8_0", "q6_k", "q4_0", "q5_0", "q5_k"}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        for name, e in table.items():
            assert torch.equal(f.get_tensor(name), blocks[name].data), name
            assert e["shape"] == list(blocks[name].shape)
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32  # embeddings stay float


@pytest.mark.parametrize("name", build_names())
def test_the_engine_computes_the_ggufs_model_row_invariantly(gguf_checkpoint, tmp_path, name):
    lib = lib_or_skip(name)
    _, ckpt = gguf_checkpoint
    fp32 = torch.float32
    blocks = load(engine_target(ckpt, tmp_path / "blocks", "auto"), NativeKernels(lib, fp32))
    assert blocks.layers[0].qkv.formats == ["q4_k", "q8_0", "q6_k"]  # one fused projection, three formats
    floats = load(engine_target(ckpt, tmp_path / "float", "float"), TorchKernels(fp32))
    ids = torch.randint(0, blocks.spec.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    a, _ = blocks.forward(ids, torch.arange(12), blocks.new_cache(16))
    b, _ = floats.forward(ids, torch.arange(12), floats.new_cache(16))
    assert (a - b).abs().max().item() <= 1e-4 * b.abs().max().item()
    assert verify_equals_decode(blocks, seed=4)


def test_draft_weights_auto_takes_a_draft_models_kept_blocks(gguf_checkpoint):
    """A GGUF draft model (convert --draft-model keeps its blocks as it keeps the target's): `draft_weights: auto`
    stores the file's bytes; a dir without kept blocks keeps every tensor float."""
    from safetensors.torch import load_file

    from eagle_trt.engine.weight_blocks import quantize_dict

    _, ckpt = gguf_checkpoint
    tensors = load_file(str(ckpt / "model.safetensors"))
    kept = block_weights.read_table(ckpt, block_weights.KEPT_TABLE)
    out, table = quantize_dict(tensors, "auto", kept_dir=ckpt)
    assert table == kept and kept
    blocks = load_file(str(ckpt / block_weights.KEPT_FILE))
    for name in kept:
        assert torch.equal(out[name], blocks[name])
    assert all(torch.equal(out[n], t) for n, t in tensors.items() if n not in kept)
    same, none = quantize_dict(tensors, "auto", kept_dir=ckpt.parent)
    assert none == {} and same.keys() == tensors.keys()
