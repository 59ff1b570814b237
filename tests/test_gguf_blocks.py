"""GGUF weights as their own blocks: bytes as the file holds them, names and row order as transformers loads them.

The references are gguf-py (`gguf.quants.dequantize` / `quantize`, what transformers' GGUF loader calls) and the
loader itself (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, what convert used until now), compared
bit for bit on float32: on tiny GGUFs written here (llama: Q/K rows permuted by llama.cpp's converter; qwen2: not;
tied and untied LM heads; every format) and on the real SmolLM2-135M-Instruct Q4_1.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from eagle_trt.convert import gguf_blocks
from eagle_trt.convert.gguf_blocks import (
    BLOCKS, BYTES_PER_256, FORMATS, QuantTensor, dequantize, quantize_rows, read_blocks,
)
from eagle_trt.errors import CheckpointError, ConfigError

gguf = pytest.importorskip("gguf")

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = Path(os.environ.get("EAGLE_TRT_SMOLLM2_GGUF", REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
GGML = {f: getattr(gguf.GGMLQuantizationType, f.upper()) for f in FORMATS}
# Byte offsets of each format's fp16 fields in a block (random bytes there could be NaN or inf).
F16_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_1": (0, 2), "q5_1": (0, 2), "q4_k": (0, 2),
              "q5_k": (0, 2), "q6_k": (208,)}
TESTED_BY_GGUF_QUANTIZE = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "bf16", "f16")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str):
    assert got.dtype == want.dtype == torch.float32, what
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (_bits(got) != _bits(want)).sum().item()
    assert diff == 0, f"{what}: {diff} of {got.numel()} weights differ"


def random_blocks(fmt: str, rows: int, row_weights: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [rows, bytes] of `fmt`: every quant bit random, the scales finite fp16 (and float formats finite)."""
    n, b = BLOCKS[fmt]
    if n == 1:  # a float format: finite values
        w = torch.randn(rows, row_weights, generator=gen)
        return {"f32": w, "f16": w.half(), "bf16": w.bfloat16()}[fmt].contiguous().view(torch.uint8)
    blocks = torch.randint(0, 256, (rows * row_weights // n, b), dtype=torch.uint8, generator=gen)
    for at in F16_FIELDS[fmt]:
        blocks[:, at:at + 2] = (torch.randn(blocks.shape[0], 1, generator=gen) * 0.02).half().view(torch.uint8)
    return blocks.reshape(rows, -1)


def gguf_dequantize(qt: QuantTensor) -> torch.Tensor:
    out = gguf.quants.dequantize(qt.data.numpy(), GGML[qt.format])
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(qt.shape)


# --- formats and de-quantization ---------------------------------------------------------------------------------

def test_format_constants_are_ggml_block_sizes():
    for fmt in FORMATS:
        assert BLOCKS[fmt] == gguf.GGML_QUANT_SIZES[GGML[fmt]], fmt
    assert BYTES_PER_256["q4_k"] == 144 and BYTES_PER_256["q6_k"] == 210 and BYTES_PER_256["q8_0"] == 272
    assert BYTES_PER_256["q4_0"] == 144 and BYTES_PER_256["bf16"] == 512


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_equals_gguf_py(fmt):
    gen = torch.Generator().manual_seed(len(fmt) * 31 + BLOCKS[fmt][1])
    qt = QuantTensor(fmt, (6, 512), random_blocks(fmt, 6, 512, gen))
    assert_same_bits(dequantize(qt), gguf_dequantize(qt), fmt)
    bias = QuantTensor(fmt, (512,), random_blocks(fmt, 1, 512, gen))  # a 1-D tensor: one row
    assert_same_bits(dequantize(bias), gguf_dequantize(bias), f"1-D {fmt}")


def test_dequantize_reads_each_field_where_ggml_puts_it():
    """Hand-made blocks, values worked out from ggml-common.h's layout (not from a reference implementation)."""
    one, half = torch.tensor([1.0]).half().view(torch.uint8), torch.tensor([0.5]).half().view(torch.uint8)
    q8 = torch.cat([half, torch.arange(-16, 16, dtype=torch.int8).view(torch.uint8)])
    assert dequantize(QuantTensor("q8_0", (32,), q8[None])).tolist() == [0.5 * v for v in range(-16, 16)]
    # q4_0: byte j = weight j (low nibble) | weight j+16 (high nibble); w = (q - 8) * d
    nib = torch.tensor([(j % 16) | ((15 - j % 16) << 4) for j in range(16)], dtype=torch.uint8)
    w = dequantize(QuantTensor("q4_0", (32,), torch.cat([one, nib])[None]))
    assert w.tolist() == [j - 8.0 for j in range(16)] + [7.0 - j for j in range(16)]
    # q6_k: weight 0 = ql[0] low nibble | (qh[0] bits 0-1) << 4, minus 32, times d * scale[0]
    b = torch.zeros(210, dtype=torch.uint8)
    b[0], b[128], b[192], b[208:210] = 0x05, 0x02, 3, half
    w = dequantize(QuantTensor("q6_k", (256,), b[None]))
    assert w[0].item() == 0.5 * 3 * ((5 | (2 << 4)) - 32) and w[1].item() == 0.5 * 3 * -32


def test_quant_tensor_checks_its_layout():
    with pytest.raises(CheckpointError, match=r"q4_k weight of shape \(4, 256\) needs uint8 data \[4, 144\]"):
        QuantTensor("q4_k", (4, 256), torch.zeros(4, 145, dtype=torch.uint8))
    with pytest.raises(CheckpointError, match="not a whole number of q8_0 blocks"):
        QuantTensor("q8_0", (4, 48), torch.zeros(4, 51, dtype=torch.uint8))
    with pytest.raises(CheckpointError, match="unknown weight format 'q3_k'"):
        QuantTensor("q3_k", (4, 256), torch.zeros(4, 110, dtype=torch.uint8))


# --- quantization ------------------------------------------------------------------------------------------------

def _weights_with_edges(gen: torch.Generator) -> torch.Tensor:
    """Random rows, plus blocks that pin the rounding: a zero block, ties at .5 steps, +max next to -max."""
    w = torch.randn(8, 256, generator=gen) * 0.05
    w[0, :32] = 0
    w[1, :32] = torch.arange(32) - 15.5  # halves: round-half-away differs from half-even here
    w[1, 0] = 127.0  # q8_0: d = 1, so the halves above are exact ties
    w[2, 32:64] = torch.linspace(-1, 1, 32)
    w[2, 40] = -1.0  # two values of equal magnitude and opposite sign: the first one's sign sets d
    return w


@pytest.mark.parametrize("fmt", TESTED_BY_GGUF_QUANTIZE)
def test_quantize_equals_gguf_py(fmt):
    w = _weights_with_edges(torch.Generator().manual_seed(7))
    qt = quantize_rows(w, fmt)
    want = gguf.quants.quantize(w.numpy(), GGML[fmt])
    assert qt.shape == (8, 256) and qt.format == fmt
    assert torch.equal(qt.data, torch.from_numpy(np.ascontiguousarray(want).view(np.uint8)).reshape(8, -1)), fmt


@pytest.mark.parametrize("fmt,bound", [("q8_0", 0.5 / 127), ("q4_0", 1 / 8), ("q4_1", 0.5 / 15), ("q5_0", 1 / 16),
                                       ("q5_1", 0.5 / 31)])
def test_quantize_round_trip_within_a_step(fmt, bound):
    """|w - dequantize(quantize(w))| stays within half a step (one step where the grid is not centred, q4_0 and
    q5_0: -8..7 times d = max/-8), relative to each block's range, plus fp16 rounding of the scale."""
    w = torch.randn(16, 512, generator=torch.Generator().manual_seed(3))
    err = (dequantize(quantize_rows(w, fmt)) - w).abs().reshape(-1, 32)
    blocks = w.reshape(-1, 32)
    scale = blocks.abs().amax(dim=1) if fmt in ("q8_0", "q4_0", "q5_0") else blocks.amax(1) - blocks.amin(1)
    assert (err.amax(dim=1) <= scale * (bound + 2 ** -10)).all(), fmt
    assert err.amax() > 0  # really quantized


def test_rounding_mutation_is_caught(monkeypatch):
    """Half-to-even rounding (torch.round) in place of C's roundf gives other q8_0 bytes than llama.cpp's."""
    from eagle_trt import quant_encode

    w = _weights_with_edges(torch.Generator().manual_seed(7))
    want = torch.from_numpy(gguf.quants.quantize(w.numpy(), GGML["q8_0"]).view(np.uint8)).reshape(8, -1)
    monkeypatch.setattr(quant_encode, "_round_away", torch.round)
    assert not torch.equal(quantize_rows(w, "q8_0").data, want)


def q4_k_reference_input() -> torch.Tensor:
    """[24, 512] float32 from numpy's legacy generator (its stream is fixed forever): weights at four scales, rows
    shifted positive (positive mins), sparse rows, a zero row and a constant row."""
    rs = np.random.RandomState(0)
    x = rs.standard_normal((24, 512)) * np.repeat([1e-4, 0.02, 1.0, 300.0], 6)[:, None]
    x[1::6] += 0.5 * np.abs(x[1::6]).max(axis=1, keepdims=True)
    x[2::6] *= rs.rand(4, 512) < 0.1
    x[3], x[4] = 0.0, 0.3
    return torch.from_numpy(x.astype(np.float32))


def test_q4_k_equals_llama_cpp_reference():
    """tests/fixtures/q4_k_reference.bin: what llama.cpp's quantize_row_q4_K_ref (ggml-quants.c, llama-cpp-python
    0.3.36's vendored llama.cpp, gcc -O3 with x86-64's default flags, as ggml-base is built) wrote for this input."""
    want = torch.from_numpy(np.fromfile(REPO / "tests" / "fixtures" / "q4_k_reference.bin", dtype=np.uint8))
    qt = quantize_rows(q4_k_reference_input(), "q4_k")
    assert qt.data.shape == (24, 288)
    assert torch.equal(qt.data.reshape(-1), want)


def test_q4_k_sum_order_mutation_is_caught(monkeypatch):
    """Sums taken in torch's own order (pairwise, vectorised) in place of C's left-to-right loop: other bytes."""
    from eagle_trt import quant_k

    want = torch.from_numpy(np.fromfile(REPO / "tests" / "fixtures" / "q4_k_reference.bin", dtype=np.uint8))
    monkeypatch.setattr(quant_k, "_seq_sum", lambda terms: torch.stack(list(terms)).sum(dim=0))
    assert not torch.equal(quantize_rows(q4_k_reference_input(), "q4_k").data.reshape(-1), want)


def test_q4_k_equals_installed_llama_cpp():
    """Against the libggml-base of an installed llama-cpp-python (the optional llama.cpp extra), on other weights."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import ctypes

    libs = sorted(Path(llama_cpp.__file__).parent.glob("lib/libggml-base.*"))
    if not libs:
        pytest.skip("llama_cpp has no lib/libggml-base")
    ref = ctypes.CDLL(str(libs[0])).quantize_row_q4_K_ref
    ref.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = np.ascontiguousarray(np.random.RandomState(5).standard_normal((64, 1024)).astype(np.float32) * 0.02)
    want = np.zeros(x.size // 256 * 144, dtype=np.uint8)
    ref(x.ctypes.data, want.ctypes.data, x.size)
    assert torch.equal(quantize_rows(torch.from_numpy(x), "q4_k").data.reshape(-1), torch.from_numpy(want))


def test_q4_k_round_trip_within_a_step():
    """Each 32-weight sub-block comes back within one step of a 4-bit grid over its range (its 6-bit scale and min
    are themselves rounded, so half a step is not a bound)."""
    w = torch.randn(16, 1024, generator=torch.Generator().manual_seed(4)) * 0.02
    err = (dequantize(quantize_rows(w, "q4_k")) - w).abs().reshape(-1, 32)
    sub = w.reshape(-1, 32)
    span = sub.amax(dim=1) - sub.amin(dim=1).clamp(max=0)
    assert (err.amax(dim=1) <= span / 15).all() and err.amax() > 0


def test_quantize_refuses_what_it_cannot_make():
    with pytest.raises(ConfigError, match="cannot quantize weights to 'q6_k'.*k-quants come from a GGUF"):
        quantize_rows(torch.zeros(4, 256), "q6_k")
    with pytest.raises(CheckpointError, match="not a whole number of q4_0 blocks"):
        quantize_rows(torch.zeros(4, 40), "q4_0")


# --- reading GGUF files: against transformers' GGUF loader ------------------------------------------------------

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
                    extra: dict[str, str] | None = None) -> Path:
    """A 2-layer model of `arch` ('llama' or 'qwen2') that transformers can load, every weight random."""
    gen = torch.Generator().manual_seed(hash((arch, tied)) % 1000)
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_name(f"tiny-{arch}")
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
        for part, fmt in {**LAYER_FORMATS, **(extra or {})}.items():
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


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", True), ("qwen2", False)])
def test_tiny_gguf_equals_transformers(tmp_path, arch, tied):
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch, tied)
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
