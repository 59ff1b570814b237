"""Quantized engines end to end on tiny models: `build` with `weights: q4_0` / `q8_0` (and `draft_weights`) writes
block tensors and says so in the manifest, `inspect` and `run --json`; speculative output (EAGLE-3 head, draft model,
the batched serve path) equals `--mode ar` of the same quantized engine token for token, on this machine's kernels
and on the AVX2 build; the weight cache maps the block layout back; bad settings are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.native.kernels import NativeKernels
from eagle_trt.runtime.loop import DecodeLoop
from eagle_trt.runtime.runner import Runner
from eagle_trt.runtime.session import Session
from eagle_trt.timing import TickClock
from lossless_support import assert_lossless
from native_support import lib_or_skip
from test_block_forward import block_target

cli = CliRunner()
PROMPTS = [[5, 6, 7, 8, 9], [100, 20, 30], list(range(40, 73))]
TREES = [dict(tree="dynamic", beam_width=4, draft_length=5, total_tokens=16),
         dict(tree="chain", draft_length=5),
         dict(tree="dynamic", beam_width=2, draft_length=3, total_tokens=8, lookup_tokens=4, lookup_branches=2)]


def build(ckpt: Path, out: Path, extra: str) -> Path:
    cfg = out.parent / f"{out.name}.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {ckpt}\nmax_input_len: 64\nmax_output_len: 128\n{extra}")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request, tiny_checkpoint, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("blocks")
    return build(tiny_checkpoint, tmp / "engine", f"dtype: {request.param}\nweights: q4_0\ndraft_weights: q8_0\n")


def test_the_engine_says_how_its_weights_are_stored(engine):
    r = cli.invoke(app, ["inspect", str(engine), "--json"])
    assert r.exit_code == 0, r.output
    manifest = json.loads(r.output)
    assert (manifest["weights"], manifest["draft_weights"]) == ("q4_0", "q8_0")
    assert manifest["block_compute"] == "int8"  # auto: int8 activations
    table = json.loads((engine / "target" / "blocks.json").read_text())["tensors"]
    assert table["lm_head.weight"] == {"format": "q4_0", "shape": [260, 64]}
    assert len(table) == 8 * 7 + 1  # every projection of the 8 layers and the LM head
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hi", "--max-new-tokens", "4", "--json"])
    assert r.exit_code == 0, r.output
    metrics = json.loads(r.output)["metrics"]
    assert (metrics["weights"], metrics["draft_weights"], metrics["lossless"]) == ("q4_0", "q8_0", True)
    assert metrics["block_compute"] == "int8"


def test_speculative_equals_ar_of_the_quantized_engine(engine):
    session = Session.open(engine)
    assert session.runner.target.lm_head.kernel == 2 and session.runner.drafter.head.qkv.kernel == 2
    for prompt in PROMPTS:
        ar = session.runner.generate(prompt, DecodeConfig(max_new_tokens=40, mode="ar", eos_token_ids=[])).token_ids
        for tree in TREES:
            res = session.runner.generate(prompt, DecodeConfig(max_new_tokens=40, eos_token_ids=[], **tree))
            assert res.token_ids == ar
    # A second open maps the stored block layout from the weight cache and decodes the same tokens.
    again = Session.open(engine)
    assert again.runner.generate(PROMPTS[0], DecodeConfig(max_new_tokens=40, mode="ar", eos_token_ids=[])
                                 ).token_ids == session.runner.generate(
        PROMPTS[0], DecodeConfig(max_new_tokens=40, mode="ar", eos_token_ids=[])).token_ids


def test_the_batched_path_equals_each_request_alone(engine):
    session = Session.open(engine)
    cfg = session.decode_config(max_new_tokens=30)
    solo = [session.runner.generate(p, session.decode_config(max_new_tokens=30, mode="ar")).token_ids
            for p in PROMPTS]
    batch = DecodeLoop(session.runner, max_batch=3)
    slots = [batch.admit(p, cfg) for p in PROMPTS]
    while batch.active:
        batch.step()
    assert [s.request.output for s in slots] == solo


@pytest.mark.parametrize("fmt, compute", [("q4_1", "float"), ("q4_0", "int8")])
def test_the_avx2_build_on_blocks(tiny_model_dir, tiny_head_dir, fmt, compute):
    lib = lib_or_skip("avx2")
    fp32 = torch.float32
    target = block_target(tiny_model_dir, fp32, NativeKernels(lib, fp32, block_compute=compute), fmt)
    assert target.lm_head.compute == compute
    runner = Runner(target, Eagle3DraftHead.load(tiny_head_dir, target), capacity=256, clock=TickClock())
    for prompt in PROMPTS[:2]:
        ar = runner.generate(prompt, DecodeConfig(max_new_tokens=32, mode="ar", eos_token_ids=[])).token_ids
        for tree in TREES:
            res = runner.generate(prompt, DecodeConfig(max_new_tokens=32, eos_token_ids=[], **tree))
            assert_lossless(runner, prompt, res.token_ids, ar)


def test_a_draft_model_engine_quantized(tiny_model_dir, tmp_path):
    from test_draft_model import noisy_copy

    draft = noisy_copy(tiny_model_dir, tmp_path / "draft", 0.05)
    ckpt = tmp_path / "ckpt"
    r = cli.invoke(app, ["convert", str(tiny_model_dir), "--draft-model", str(draft), "--output", str(ckpt), "--json"])
    assert r.exit_code == 0, r.output
    # block_compute: float keeps the fp32 block path end to end (the default, auto, is int8).
    engine = build(ckpt, tmp_path / "engine", "weights: q8_0\ndraft_weights: q4_0\nblock_compute: float\n")
    assert (engine / "draft" / "blocks.json").is_file()
    session = Session.open(engine, clock=TickClock())  # tau below counts the copies the gate lets through
    assert session.runner.drafter.model.lm_head.kernel == 2 and session.block_compute == "float"
    assert session.runner.target.lm_head.compute == session.runner.drafter.model.lm_head.compute == "float"
    for prompt in PROMPTS:
        ar = session.runner.generate(prompt, DecodeConfig(max_new_tokens=30, mode="ar", eos_token_ids=[])).token_ids
        for tree in TREES[:2]:
            res = session.runner.generate(prompt, DecodeConfig(max_new_tokens=30, eos_token_ids=[], **tree))
            assert res.token_ids == ar
        assert res.metrics.acceptance_length > 1.2  # a near copy of the target drafts: its tokens were accepted


def test_bad_weights_settings_are_one_line_errors(tiny_checkpoint, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: t\ncheckpoint_dir: {tiny_checkpoint}\nmax_input_len: 64\nmax_output_len: 64\nweights: q4_k\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "e")])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert "weights: q4_k: tensor 'lm_head.weight' [260, 64] has an input size that is not a multiple of 256" in r.output
    assert "use weights: q4_0 or q8_0 (blocks of 32) or weights: float" in r.output  # 64 is whole 32-blocks
    cfg.write_text(f"name: t\ncheckpoint_dir: {tiny_checkpoint}\nweights: q6_k\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "e")])
    assert r.exit_code == 2 and "weights" in r.output and "q6_k" in r.output
    cfg.write_text(f"name: t\ncheckpoint_dir: {tiny_checkpoint}\nbackend: trtllm\nweights: q8_0\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "e"), "--dry-run"])
    assert r.exit_code == 2 and "weights q8_0 is for backend torch" in r.output
    cfg.write_text(f"name: t\ncheckpoint_dir: {tiny_checkpoint}\nbackend: trtllm\nblock_compute: int8\n")
    r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "e"), "--dry-run"])
    assert r.exit_code == 2 and "block_compute int8 is for backend torch" in r.output


def test_tune_measures_the_quantized_engine_and_keys_its_choice_by_format(engine, tmp_path):
    import shutil

    from eagle_trt.bench.tune_store import store_tuned
    from eagle_trt.errors import CheckpointError
    from eagle_trt.runtime.session import TUNED_NAME

    copy = tmp_path / "engine"
    shutil.copytree(engine, copy)
    r = cli.invoke(app, ["tune", "--engine", str(copy), "--limit", "1", "--max-new-tokens", "12", "--positions", "2",
                         "--max-depth", "3", "--beams", "1,2", "--validate", "1", "--validate-repeats", "1",
                         "--lookup-tokens", "0", "--json"])
    assert r.exit_code == 0, r.output
    tuned = json.loads((copy / TUNED_NAME).read_text())
    assert (tuned["weights"], tuned["kernels"]) == ("q4_0", Session.open(copy).kernels)
    # Settings chosen on another format's verify-cost curve are refused, not silently used.
    store_tuned(copy, {**tuned, "predicted_tokens_per_second": 1.0, "tau": 1.0}, {"weights": "float"})
    with pytest.raises(CheckpointError, match="tuned for float weights, the engine has q4_0"):
        Session.open(copy).decode_config()
