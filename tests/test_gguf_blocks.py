"""GGUF weights as their own blocks: bytes as the file holds them, names and row order as transformers loads them.

The references are gguf-py (`gguf.quants.dequantize` / `quantize`, what transformers' GGUF loader calls) and the
loader itself (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, what convert used until now), compared
bit for bit on float32: on tiny GGUFs written here (llama: Q/K rows permuted by llama.cpp's converter; qwen2: not;
tied and untied LM heads; every format) and on the real SmolLM2-135M-Instruct Q4_1. The formats themselves:
tests/test_quant_blocks.py.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle_trt.convert.gguf_blocks import dequantize, read_blocks
from eagle_trt.errors import CheckpointError

from quant_support import (
    GGML, REPO, TESTED_BY_GGUF_QUANTIZE, assert_same_bits, random_blocks,
)

SMOLLM2 = Path(os.environ.get("EAGLE_TRT_SMOLLM2_GGUF", REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 256, 512, 4, 2, 2, 96
# One format per projection, so each is read through a tiny file (k-quants as random blocks: gguf-py cannot make
# them; the rest quantized by gguf-py from random weights).
LAYER_FORMATS = {"attn_q": "q4_k", "attn_k": "q8_0", "attn_v": "q6_k", "attn_output": "q4_0", "ffn_gate": "q5_0",
                 "ffn_up": "q5_1", "ffn_down": "q5_k"}


def _add(writer, name: str, fmt: str, shape: tuple[int, ...], gen: torch.Generator):
    """Add tensor `name` of HF `shape` in `fmt` to `writer`."""
    if fmt in TESTED_BY_GGUF_QUANTIZE or fmt == "f32":
        w = (torch.randn(*shape, generator=gen) * 0.05).numpy()
        data = w if fmt == "f32" else gguf.quants.quantize(w, GGML[fmt])
    else:
        data = random_blocks(fmt, *((1, shape[0]) if len(shape) == 1 else shape), gen).numpy()
        data = data.reshape(-1) if len(shape) == 1 else data
    if fmt == "f32":
        writer.add_tensor(name, data)
    else:
        writer.add_tensor(name, data.view(np.uint8), raw_dtype=GGML[fmt])  # the byte shape: [rows, bytes]


def write_tiny_gguf(path: Path, arch: str, tied: bool, embed_fmt: str = "q8_0", head_fmt: str = "q6_k",
                    name: str = "") -> Path:
    """A 2-layer model of `arch` ('llama' or 'qwen2') that transformers can load, every weight random."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{arch} {tied} {embed_fmt} {head_fmt} {name}".encode()))
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_name(name or f"tiny-{arch}")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    _add(writer, "token_embd.weight", embed_fmt, (VOCAB, HIDDEN), gen)
    if not tied:
        _add(writer, "output.weight", head_fmt, (VOCAB, HIDDEN), gen)
    _add(writer, "output_norm.weight", "f32", (HIDDEN,), gen)
    head_dim = HIDDEN // HEADS
    out_features = {"attn_q": HIDDEN, "attn_k": KV_HEADS * head_dim, "attn_v": KV_HEADS * head_dim,
                    "attn_output": HIDDEN, "ffn_gate": FFN, "ffn_up": FFN, "ffn_down": HIDDEN}
    for i in range(LAYERS):
        for part, fmt in LAYER_FORMATS.items():
            in_features = FFN if part == "ffn_down" else HIDDEN
            _add(writer, f"blk.{i}.{part}.weight", fmt, (out_features[part], in_features), gen)
        for norm in ("attn_norm", "ffn_norm"):
            _add(writer, f"blk.{i}.{norm}.weight", "f32", (HIDDEN,), gen)
        if arch == "qwen2":
            for part in ("attn_q", "attn_k", "attn_v"):
                _add(writer, f"blk.{i}.{part}.bias", "f32", (out_features[part],), gen)
    writer.add_tensor("rope_freqs.weight", np.ones(head_dim // 2, dtype=np.float32))  # HF has no such parameter
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_state_dict(path: Path) -> dict[str, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True, trust_remote_code=False)
    return {k: v.detach() for k, v in model.state_dict().items()}


def assert_matches_transformers(path: Path, want: dict[str, torch.Tensor]):
    blocks = read_blocks(path)
    assert sorted(blocks) == sorted(want)
    for name, qt in blocks.items():
        assert qt.data.dtype == torch.uint8 and qt.data.shape[0] == (qt.shape[0] if len(qt.shape) == 2 else 1)
        assert_same_bits(dequantize(qt), want[name], name)
    return blocks


@pytest.mark.parametrize("arch,tied,embed_fmt,head_fmt,name", [
    ("llama", False, "f16", "bf16", ""), ("llama", True, "q8_0", "", ""), ("qwen2", True, "q4_1", "", ""),
    ("qwen2", False, "q8_0", "q6_k", ""), ("llama", True, "q5_k", "", "tiny-mistral"),
])
def test_tiny_gguf_equals_transformers(tmp_path, arch, tied, embed_fmt, head_fmt, name):
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch, tied, embed_fmt, head_fmt, name)
    blocks = assert_matches_transformers(path, transformers_state_dict(path))
    assert (blocks["lm_head.weight"] is blocks["model.embed_tokens.weight"]) == tied
    assert blocks["model.layers.0.self_attn.q_proj.weight"].format == "q4_k"
    assert blocks["model.layers.1.mlp.down_proj.weight"].format == "q5_k"
    # The permutation is real: llama's Q/K rows are not the file's order, qwen2's are.
    raw = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    for part, hf in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
        file_rows = torch.from_numpy(np.array(raw[f"blk.0.{part}.weight"].data))
        same = torch.equal(blocks[f"model.layers.0.self_attn.{hf}.weight"].data, file_rows)
        assert same == (arch == "qwen2"), part


def test_untouched_tensors_are_the_files_bytes_without_a_copy(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", tied=True)
    a = read_blocks(path, ["model.layers.0.mlp.up_proj.weight"])["model.layers.0.mlp.up_proj.weight"]
    b = read_blocks(path, ["model.layers.0.mlp.up_proj.weight"])["model.layers.0.mlp.up_proj.weight"]
    raw = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}["blk.0.ffn_up.weight"]
    assert torch.equal(a.data, torch.from_numpy(np.array(raw.data)))
    assert a.data.data_ptr() != b.data.data_ptr()  # two maps of the file, neither a materialised copy
    assert not a.data.untyped_storage().resizable()  # numpy-backed (the map), not a torch allocation


def test_names_select_and_missing_names_fail(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", tied=True)
    got = read_blocks(path, ["lm_head.weight", "model.norm.weight"])
    assert list(got) == ["lm_head.weight", "model.norm.weight"] and got["lm_head.weight"].format == "q8_0"
    with pytest.raises(CheckpointError, match=r"m\.gguf has no tensor model\.layers\.9\.mlp\.up_proj\.weight"):
        read_blocks(path, ["model.layers.9.mlp.up_proj.weight"])


def test_unsupported_ggml_type_is_named(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", tied=True)
    raw = tmp_path / "q2.gguf"
    writer = gguf.GGUFWriter(str(raw), arch="qwen2")
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((FFN, HIDDEN // 256 * 84), dtype=np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match=r"tensor blk\.0\.ffn_up\.weight is ggml type Q2_K") as e:
        read_blocks(raw)
    assert "\n" not in str(e.value)
    assert read_blocks(path)  # the tiny one reads


def test_unsupported_architecture_and_missing_head_counts(tmp_path):
    def write(name, arch, heads):
        writer = gguf.GGUFWriter(str(tmp_path / name), arch=arch)
        if heads:
            writer.add_head_count(HEADS)
        writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return tmp_path / name

    with pytest.raises(CheckpointError, match="unsupported architecture 'gpt2'"):
        read_blocks(write("g.gguf", "gpt2", True))
    with pytest.raises(CheckpointError, match=r"llama\.attention\.head_count_kv"):
        read_blocks(write("l.gguf", "llama", True))


def test_truncated_gguf_fails_in_one_line(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", tied=True)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated GGUF") as e:
        read_blocks(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_gguf_file_layout_equals_gguf_py(tmp_path):
    """The header walk finds every tensor where gguf-py's reader does, and the scalar metadata it decodes."""
    from eagle_trt.convert.gguf_file import GGML_TYPES, GGUFFile

    for type_id, (name, n, b) in GGML_TYPES.items():
        qtype = gguf.GGMLQuantizationType(type_id)
        assert qtype.name == name and gguf.GGML_QUANT_SIZES[qtype] == (n, b), name
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", tied=False)
    gf, reader = GGUFFile.open(path), gguf.GGUFReader(str(path))
    assert list(gf.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = gf.tensors[t.name]
        assert (info.offset, info.nbytes, info.dims, info.ggml_type) == (
            t.data_offset, t.n_bytes, tuple(int(d) for d in t.shape), int(t.tensor_type)), t.name
        assert np.array_equal(gf.raw(info), np.asarray(t.data).reshape(-1).view(np.uint8)), t.name
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            want = field.contents()
            assert gf.metadata[key] == (None if isinstance(want, list) else want), key


def test_not_a_gguf_and_unknown_version(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", tied=True)
    data = bytearray(path.read_bytes())
    (tmp_path / "h.gguf").write_bytes(bytes(data[:40]))  # cut inside the key-value section
    with pytest.raises(CheckpointError, match="truncated GGUF"):
        read_blocks(tmp_path / "h.gguf")
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(data[4:]))
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        read_blocks(tmp_path / "x.gguf")
    data[4:8] = (7).to_bytes(4, "little")
    (tmp_path / "v.gguf").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="GGUF version 7; eagle-trt reads versions 2 and 3"):
        read_blocks(tmp_path / "v.gguf")


@pytest.mark.slow
def test_smollm2_equals_transformers():
    """The real SmolLM2-135M-Instruct Q4_1 (Q8_0 embedding, tied head, llama's Q/K permutation): every tensor."""
    if not SMOLLM2.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{SMOLLM2} is missing: `make model` must run before the tests in CI")
        pytest.skip(f"{SMOLLM2} not found; run `make model`")
    blocks = assert_matches_transformers(SMOLLM2, transformers_state_dict(SMOLLM2))
    formats = {qt.format for qt in blocks.values()}
    assert formats == {"q4_1", "q8_0", "f32"}
    assert blocks["lm_head.weight"] is blocks["model.embed_tokens.weight"]


def test_the_interface_convert_and_build_import():
    from eagle_trt.convert import gguf_blocks
    from eagle_trt import quant_blocks, quant_encode

    assert gguf_blocks.QuantTensor is quant_blocks.QuantTensor and gguf_blocks.dequantize is quant_blocks.dequantize
    assert gguf_blocks.quantize_rows is quant_encode.quantize_rows
    assert set(gguf_blocks.FORMATS) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k",
                                        "q6_k"}
    assert gguf_blocks.BYTES_PER_256 == {f: b * 256 // n for f, (n, b) in gguf_blocks.BLOCKS.items()}


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> bytes:
    writer_dir = tmp_path_factory.mktemp("fuzz")
    writer = gguf.GGUFWriter(str(writer_dir / "m.gguf"), arch="llama")
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_token_list(["a", "bc", "d"])
    writer.add_tensor("blk.0.attn_k.weight", gguf.quants.quantize(np.ones((4, 32), np.float32), GGML["q8_0"]),
                      raw_dtype=GGML["q8_0"])
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return (writer_dir / "m.gguf").read_bytes()


@settings(max_examples=int(os.environ.get("EAGLE_TRT_FUZZ_EXAMPLES", "150")), deadline=5000, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 500), st.binary(min_size=1, max_size=8)), max_size=3),
       cut=st.one_of(st.none(), st.integers(0, 700)))
def test_damaged_gguf_is_a_checkpoint_error_or_reads(tmp_path_factory, small_gguf, edits, cut):
    """Any overwrite or cut of the header: a one-line CheckpointError, or tensors that de-quantize; nothing else."""
    data = bytearray(small_gguf)
    for at, chunk in edits:
        at %= len(data)
        data[at:at + len(chunk)] = chunk
    path = tmp_path_factory.mktemp("damaged") / "m.gguf"
    path.write_bytes(bytes(data if cut is None else data[:cut]))
    try:
        for qt in read_blocks(path).values():
            dequantize(qt)
    except CheckpointError as e:
        assert "\n" not in str(e)


QWEN_GGUFS = [REPO / "models" / f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf" for size in ("0.5b", "1.5b")]


@pytest.mark.slow
@pytest.mark.parametrize("path", QWEN_GGUFS, ids=lambda p: p.name)
def test_qwen_q4_k_m_blocks_equal_gguf_py(path):
    """The Qwen2.5-Coder Q4_K_M files `make qwen` fetches (Q4_K, Q6_K and the fallbacks of rows that are not whole
    super-blocks): the first layer, the norms and the embedding against gguf-py, tensor by tensor (the full
    transformers comparison is SmolLM2's; these take minutes to load)."""
    if not path.is_file():
        pytest.skip(f"{path} not found; run `make qwen`")
    from eagle_trt.convert.gguf_blocks import hf_name

    reader = {hf_name(t.name): t for t in gguf.GGUFReader(str(path)).tensors}
    names = [n for n in reader if n and (".layers.0." in n or "layers" not in n)]
    blocks = read_blocks(path, names)
    for name, qt in blocks.items():
        t = reader[name]
        want = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32))
        assert_same_bits(dequantize(qt), want.reshape(qt.shape), name)
