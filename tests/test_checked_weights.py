"""Weights that are not what they claim are refused before anything is written, each with one line naming the file and
the tensor or field and what to do (exit 2):

- a head: `export`, `convert --head` and `build` run the same checks (engine/head_checks.py): config fields, shapes,
  aux layer ids within the target, draft_vocab_size, every tensor finite, d2t inside the target vocab and one to one,
  t2d consistent with d2t;
- a GGUF target: a non-finite block scale or float value (convert, before the slow load, naming the tensor), a
  block_count its tensors do not bear out (a fast error, where transformers spent minutes and then filled the
  missing layers with random weights), misaligned or overlapping tensor offsets;
- a checkpoint's target weights at build: non-finite float values or block scales;
- the runtime: finite weights of absurd size overflow to inf / NaN hidden states: an error, never NaN tokens.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import pytest
import torch
from conftest import write_random_head
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import gguf_support
from eagle_trt.cli.app import app
from eagle_trt.convert import convert_model
from eagle_trt.convert.gguf_file import GGUFFile
from eagle_trt.convert.load_target import load_target
from eagle_trt.errors import CheckpointError
from eagle_trt.quant_blocks import BLOCKS
from quant_support import F16_FIELDS

cli = CliRunner()
DRAFT_VOCAB = 64


def one_line_exit_2(r, *names: str) -> str:
    """The command exited 2 with one error line (last on stderr, after any progress lines) naming `names`."""
    assert r.exit_code == 2, r.output
    errors = [x for x in r.stderr.splitlines() if x.startswith("Error: ")]
    line = r.stderr.strip().splitlines()[-1]
    assert errors == [line] and "Traceback" not in r.output, r.stderr
    for name in names:
        assert name in line, (name, line)
    return line


def only(root: Path, *names: str) -> None:
    """Nothing but `names` in root: no output, no staging dir left behind."""
    assert sorted(p.name for p in root.iterdir()) == sorted(names)


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny target with a random head over a 64-token draft vocab (d2t: draft id i -> target id 2i)."""
    tmp = tmp_path_factory.mktemp("checked")
    head = write_random_head(tmp / "head", seed=3, aux=(1, 3, 4), draft_vocab=DRAFT_VOCAB)
    w = load_file(str(head / "model.safetensors"))
    w["d2t"] = torch.arange(DRAFT_VOCAB)  # target id 2i
    save_file(w, str(head / "model.safetensors"))
    return convert_model(tiny_model_dir, tmp / "ckpt", head=head, progress=False, calibrate_kv=False).output_dir


def _set(w: dict, name: str, index: int, value: float) -> None:
    w[name].view(-1)[index] = value


def _t2d(w: dict, flip: int) -> None:
    mask = torch.zeros(260, dtype=torch.bool)
    mask[torch.arange(DRAFT_VOCAB) * 2] = True
    mask[flip] = not bool(mask[flip])
    w["t2d"] = mask


# (what the config gets, what the tensors get, what the error names besides the file)
BAD_HEADS = {
    "hidden_size": ({"hidden_size": 32}, None, "hidden_size (32)"),
    "num_attention_heads_0": ({"num_attention_heads": 0}, None, "num_attention_heads"),
    "draft_vocab_size_huge": ({"draft_vocab_size": 10**12}, None, "draft_vocab_size (1000000000000)"),
    "aux_ids_past_the_target": ({"eagle_aux_hidden_state_layer_ids": [1, 14, 999],
                                 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 999]}}, None,
                                "[1, 14, 999]"),
    "fc_10x10": (None, lambda w: w.__setitem__("fc.weight", torch.zeros(10, 10)), "fc.weight has shape [10, 10]"),
    "nan_weight": (None, lambda w: _set(w, "layers.0.mlp.up_proj.weight", 3, float("nan")),
                   "layers.0.mlp.up_proj.weight holds inf or NaN"),
    "inf_weight": (None, lambda w: _set(w, "norm.weight", 0, float("-inf")), "norm.weight holds inf or NaN"),
    "d2t_plus_1e9": (None, lambda w: w["d2t"].__setitem__(5, 10**9), "d2t[5] = 1000000000"),
    "d2t_minus_1e9": (None, lambda w: w["d2t"].__setitem__(5, -10**9), "d2t[5] = -1000000000"),
    "d2t_two_to_one": (None, lambda w: w["d2t"].__setitem__(5, w["d2t"][4] - 1), "two draft ids to one target id"),
    "t2d_disagrees": (None, lambda w: _t2d(w, 11), "t2d and d2t disagree at target id 11"),
}


def damaged_head(src: Path, dst: Path, case: str) -> Path:
    """A copy of src (a checkpoint or a head dir) whose head (draft/ or itself) has one BAD_HEADS case."""
    shutil.copytree(src, dst)
    head = dst / "draft" if (dst / "draft").is_dir() else dst
    cfg_update, edit, _ = BAD_HEADS[case]
    if cfg_update:
        cfg = json.loads((head / "config.json").read_text())
        nested = {**cfg.get("eagle_config", {}), **cfg_update.get("eagle_config", {})}
        (head / "config.json").write_text(json.dumps({**cfg, **cfg_update, "eagle_config": nested}))
    if edit:
        w = load_file(str(head / "model.safetensors"))
        edit(w)
        save_file(w, str(head / "model.safetensors"))
    return dst


@pytest.mark.parametrize("case", BAD_HEADS)
def test_export_refuses_a_bad_head(ckpt, tmp_path, case):
    src = damaged_head(ckpt, tmp_path / "src", case)
    r = cli.invoke(app, ["export", str(src), "--format", "vllm", "--output", str(tmp_path / "out")])
    one_line_exit_2(r, str(src / "draft"), BAD_HEADS[case][2])
    only(tmp_path, "src")


@pytest.mark.parametrize("case", ["nan_weight", "inf_weight", "d2t_plus_1e9", "d2t_minus_1e9", "t2d_disagrees",
                                  "draft_vocab_size_huge", "aux_ids_past_the_target"])
def test_convert_head_refuses_a_bad_head(ckpt, tiny_model_dir, tmp_path, case):
    head = damaged_head(ckpt / "draft", tmp_path / "head", case)
    r = cli.invoke(app, ["convert", str(tiny_model_dir), "--head", str(head), "--output", str(tmp_path / "out"),
                         "--no-calibrate-kv"])
    one_line_exit_2(r, str(head), BAD_HEADS[case][2])
    only(tmp_path, "head")


@pytest.mark.parametrize("case", ["nan_weight", "d2t_two_to_one", "t2d_disagrees"])
def test_build_refuses_a_bad_head(ckpt, tmp_path, case):
    src = damaged_head(ckpt, tmp_path / "ckpt", case)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {src}\nmax_input_len: 64\nmax_output_len: 64\n")
    for dry in ([], ["--dry-run"]):
        r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "engine"), *dry])
        one_line_exit_2(r, str(src / "draft" / "model.safetensors"), BAD_HEADS[case][2])
        only(tmp_path, "ckpt", "cfg.yaml")


def test_the_shipped_heads_pass(ckpt, tmp_path):
    """The checks refuse nothing good: the checkpoint's head exports, and the heads in heads/ pass them."""
    from eagle_trt.interop.export import read_ours

    r = cli.invoke(app, ["export", str(ckpt), "--format", "vllm", "--output", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    for head in sorted(Path(__file__).parents[1].glob("heads/*/config.json")):
        read_ours(head.parent)


def test_export_of_an_engine_with_draft_blocks_writes_float_weights(ckpt, tmp_path):
    """An engine built with draft_weights: q8_0 keeps the head's projections as blocks (blocks.json): export reads
    them de-quantized, where it wrote their uint8 rows as the head's weights."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {ckpt}\nmax_input_len: 64\nmax_output_len: 64\ndraft_weights: q8_0\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "engine")])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["export", str(tmp_path / "engine"), "--format", "vllm", "--output", str(tmp_path / "v")])
    assert r.exit_code == 0, r.output
    got = load_file(str(tmp_path / "v" / "model.safetensors"))["fc.weight"]
    want = load_file(str(ckpt / "draft" / "model.safetensors"))["fc.weight"]
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert (got - want).abs().max() <= want.abs().max() / 127  # one q8_0 step at most


# ---- GGUF targets ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory) -> tuple[bytes, dict]:
    data = gguf_support.write_model_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf").read_bytes()
    return data, gguf_support.tensor_layout(data)


def _edited(tmp_path: Path, data: bytes, edits: dict[int, bytes]) -> Path:
    raw = bytearray(data)
    for at, chunk in edits.items():
        raw[at:at + len(chunk)] = chunk
    path = tmp_path / "m.gguf"
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.1.attn_v.weight",
                                    "blk.0.attn_output.weight", "blk.1.ffn_gate.weight", "blk.0.ffn_up.weight",
                                    "blk.1.ffn_down.weight", "token_embd.weight", "output.weight",
                                    "output_norm.weight"])
def test_a_non_finite_scale_is_refused_before_the_load(gguf_model, tmp_path, tensor):
    """Each format's last scale field (dmin, m, or d), in the last block, or a float value: NaN."""
    data, layout = gguf_model
    e = layout[tensor]
    fmt = gguf_support.FORMAT_OF[e.ggml_type]
    n, b = BLOCKS[fmt]
    last_block = e.data_at + e.nbytes - b
    if n == 1:
        edit = {last_block: struct.pack("<f", float("nan")) if fmt == "f32" else struct.pack("<H", 0x7E00)}
    else:
        edit = {last_block + F16_FIELDS[fmt][-1]: struct.pack("<H", 0x7C00)}
    path = _edited(tmp_path, data, edit)
    with pytest.raises(CheckpointError, match=rf"{tensor} \(\w+\) has a non-finite .* at (block|element) "
                                              rf"{e.nbytes // b - 1};") as info:
        load_target(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("count, says", [(100, r"block_count is 100 but the file holds layers 0-1; the tensors of "
                                                r"layer 2 \(blk\.2\.\*\) are missing"),
                                         (1, r"block_count is 1 but the file has tensors of layer 1")])
def test_a_block_count_the_tensors_do_not_bear_out_is_a_fast_error(gguf_model, tmp_path, count, says):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_support.set_metadata_int(gguf_model[0], "llama.block_count", count))
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=says):
        load_target(path)
    assert time.monotonic() - start < 5  # the header and the scales only: nothing is loaded


def test_misaligned_and_overlapping_offsets(gguf_model, tmp_path):
    data, layout = gguf_model
    e, other = layout["blk.0.ffn_up.weight"], layout["blk.1.attn_q.weight"]
    path = _edited(tmp_path, data, {e.offset_at: struct.pack("<Q", e.offset + 2)})
    with pytest.raises(CheckpointError, match="blk.0.ffn_up.weight starts at data offset .* not a multiple of "
                                              "general.alignment 32"):
        GGUFFile.open(path)
    path = _edited(tmp_path, data, {e.offset_at: struct.pack("<Q", other.offset + 64)})
    with pytest.raises(CheckpointError, match="tensors blk.1.attn_q.weight and blk.0.ffn_up.weight overlap"):
        GGUFFile.open(path)
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), arch="llama")
    w.add_custom_alignment(64)
    for i in range(3):
        w.add_tensor(f"t{i}", np.zeros(24, dtype=np.float32))  # 96 bytes, padded to 128
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    aligned = (tmp_path / "a.gguf").read_bytes()
    path.write_bytes(gguf_support.set_metadata_int(aligned, "general.alignment", 48))
    with pytest.raises(CheckpointError, match="general.alignment is 48, not a power of two"):
        GGUFFile.open(path)
    path.write_bytes(gguf_support.set_metadata_int(aligned, "general.alignment", 256))
    with pytest.raises(CheckpointError, match="tensor t1 starts at data offset 128, not a multiple of "
                                              "general.alignment 256"):
        GGUFFile.open(path)


@pytest.mark.parametrize("fmt", [f for f in BLOCKS])
def test_first_nonfinite_finds_the_block(fmt):
    from quant_support import random_blocks

    from eagle_trt.quant_blocks import QuantTensor, dequantize, first_nonfinite

    n, b = BLOCKS[fmt]
    blocks = random_blocks(fmt, 4, 512, torch.Generator().manual_seed(0))
    assert first_nonfinite(fmt, blocks) is None
    flat = blocks.reshape(-1, b)
    for at in F16_FIELDS.get(fmt, (0,)):
        for bits in (0x7C00, 0xFC00, 0x7E01):
            bad = flat.clone()
            row = 37 % bad.shape[0]
            if fmt == "f32":
                bad.view(torch.float32)[row] = float("nan")
            elif fmt == "bf16":
                bad[row].view(torch.int16)[0] = 0x7FC0
            else:
                bad[row, at:at + 2].view(torch.int16)[0] = struct.unpack("<h", struct.pack("<H", bits))[0]
            assert first_nonfinite(fmt, bad.reshape(blocks.shape)) == row, (fmt, at, bits)
            # the claim the check rests on: a block's weights are finite exactly when its scale fields are
            w = dequantize(QuantTensor(fmt, (4, 512), bad.reshape(blocks.shape))).reshape(-1, n)
            assert not torch.isfinite(w[row]).all() and torch.isfinite(torch.cat([w[:row], w[row + 1:]])).all()


def test_convert_refuses_non_finite_weights_of_an_hf_model(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    w = load_file(str(model / "model.safetensors"))
    w["model.layers.2.self_attn.o_proj.weight"][1, 2] = float("nan")
    save_file(w, str(model / "model.safetensors"))
    with pytest.raises(CheckpointError, match="tensor model.layers.2.self_attn.o_proj.weight holds inf or NaN"):
        load_target(model)


# ---- a checkpoint's target weights at build --------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf_ckpt(gguf_model, tmp_path_factory) -> Path:
    """`convert --head` of the tiny GGUF: the de-quantized target and the file's own blocks."""
    tmp = tmp_path_factory.mktemp("gguf-ckpt")
    (tmp / "m.gguf").write_bytes(gguf_model[0])
    head = gguf_support.write_head(tmp / "head")
    return convert_model(tmp / "m.gguf", tmp / "ckpt", head=head, progress=False, calibrate_kv=False).output_dir


@pytest.mark.parametrize("where", ["float", "blocks"])
def test_build_refuses_non_finite_target_weights(gguf_ckpt, tmp_path, where):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(gguf_ckpt, ckpt)
    name = "model.layers.1.mlp.down_proj.weight"
    file = ckpt / "target" / ("model.safetensors" if where == "float" else "gguf_blocks.safetensors")
    w = load_file(str(file))
    if where == "float":
        w[name].view(-1)[-1] = float("inf")
    else:  # q5_k: the dmin of its last block
        w[name].view(-1, BLOCKS["q5_k"][1])[-1, 2:4].view(torch.int16)[0] = 0x7E00
    save_file(w, str(file))
    cfg = tmp_path / "cfg.yaml"
    weights = "auto" if where == "blocks" else "float"
    cfg.write_text(f"name: g\ncheckpoint_dir: {ckpt}\nmax_input_len: 32\nmax_output_len: 16\nweights: {weights}\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "engine")])
    one_line_exit_2(r, str(file), f"tensor {name}")
    only(tmp_path, "ckpt", "cfg.yaml")


def test_weights_that_overflow_are_an_error_not_nan_tokens(gguf_ckpt, tmp_path):
    """Finite norm weights of absurd size (a flipped exponent byte): the hidden states overflow; `run` says so."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(gguf_ckpt, ckpt)
    file = ckpt / "target" / "model.safetensors"
    w = load_file(str(file))
    w["model.layers.0.post_attention_layernorm.weight"].fill_(3e38)
    save_file(w, str(file))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: g\ncheckpoint_dir: {ckpt}\nmax_input_len: 32\nmax_output_len: 16\nweights: auto\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "engine")])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["run", "--engine", str(tmp_path / "engine"), "--prompt", gguf_support.PROMPT, "--no-chat",
                         "--max-new-tokens", "4", "--json"])
    one_line_exit_2(r, str(tmp_path / "engine" / "target"), "overflow to inf or NaN")
