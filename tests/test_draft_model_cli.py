"""Draft models through the CLI: convert --draft-model (tokenizers compared first), build (the config's draft kind,
the checkpoint's checks), run, bench (draft-model methods, HF's assistant_model), tune, and the TensorRT-LLM bundle of
each line (Draft_Target with the fields that line defines)."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.config import EagleConfig
from eagle_trt.engine import build_engine, read_manifest
from eagle_trt.engine import trtllm_backend, trtllm_bundle
from eagle_trt.runtime import trtllm_runner
from eagle_trt.engine.trtllm_lines import LINES
from test_draft_model import noisy_copy
from trtllm_fakes import CONTRACTS, VERSIONS, FakeLLM, contract_violations, fake_modules, line_fields

cli = CliRunner()


@pytest.fixture(scope="module")
def pair(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    return tiny_model_dir, noisy_copy(tiny_model_dir, root / "draft", 0.05)


@pytest.fixture(scope="module")
def ckpt(pair, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dm") / "ckpt"
    r = cli.invoke(app, ["convert", str(pair[0]), "--draft-model", str(pair[1]), "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return out


def config_file(tmp_path: Path, ckpt: Path, extra: str = "") -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(f"name: tiny-dm\ncheckpoint_dir: {ckpt}\nmax_input_len: 64\nmax_output_len: 128\n"
                    f"draft_length: 4\nbeam_width: 4\ntotal_tokens: 12\n{extra}")
    return path


@pytest.fixture(scope="module")
def engine(ckpt, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("dm-engine")
    r = cli.invoke(app, ["build", "-c", str(config_file(tmp, ckpt)), "-o", str(tmp / "engine")])
    assert r.exit_code == 0, r.output
    return tmp / "engine"


def one_line_error(result, code=2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result.stderr.strip().splitlines()[0]


# ---- convert ----------------------------------------------------------------------------------------

def test_convert_writes_target_and_draft_model(ckpt, pair):
    info = json.loads((ckpt / "convert.json").read_text())
    assert info["draft_kind"] == "model" and info["draft_source"]["path"] == str(pair[1])
    for sub in ("target", "draft"):
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (ckpt / sub).iterdir()}
    assert not (ckpt / "kv_scales.safetensors").exists()


def _edit_tokenizer(src: Path, out: Path, vocab=None, config=None) -> Path:
    shutil.copytree(src, out)
    tok = json.loads((out / "tokenizer.json").read_text())
    if vocab:
        tok["model"]["vocab"] = {vocab.get(t, t): i for t, i in tok["model"]["vocab"].items()}
        (out / "tokenizer.json").write_text(json.dumps(tok))
    if config:
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        (out / "tokenizer_config.json").write_text(json.dumps({**cfg, **config}))
    return out


def test_convert_refuses_another_vocabulary(pair, tmp_path):
    tok = json.loads((pair[1] / "tokenizer.json").read_text())["model"]["vocab"]
    a, b = sorted(tok, key=tok.get)[65:67]  # ids 65 and 66 swap their texts in the draft
    draft = _edit_tokenizer(pair[1], tmp_path / "d", vocab={a: b, b: a})
    r = cli.invoke(app, ["convert", str(pair[0]), "--draft-model", str(draft), "-o", str(tmp_path / "out")])
    assert one_line_error(r) == (f"Error: --draft-model {draft} does not share the target's tokenizer: token id 65 is "
                                 f"{a!r} in the target's tokenizer and {b!r} in the draft's")
    assert not (tmp_path / "out").exists()


def test_convert_refuses_other_special_tokens(pair, tmp_path):
    draft = _edit_tokenizer(pair[1], tmp_path / "d", config={"eos_token": "<pad>"})
    r = cli.invoke(app, ["convert", str(pair[0]), "--draft-model", str(draft), "-o", str(tmp_path / "out")])
    assert one_line_error(r).endswith("the eos token is '</s>' in the target's tokenizer and '<pad>' in the draft's")


@pytest.mark.parametrize("flags,named", [(["--steps", "2"], "--steps"), (["--draft-vocab-size", "8"],
                                                                          "--draft-vocab-size")])
def test_convert_refuses_head_options(pair, tmp_path, flags, named):
    r = cli.invoke(app, ["convert", str(pair[0]), "--draft-model", str(pair[1]), "-o", str(tmp_path / "o"), *flags])
    assert one_line_error(r) == f"Error: --draft-model drafts with a small LM, which needs no head: drop {named}"


# ---- build ------------------------------------------------------------------------------------------

def test_build_records_the_draft_model(engine):
    m = read_manifest(engine)
    assert m.draft.kind == "model" and m.draft.aux_layer_ids == [] and m.draft.draft_vocab_size == 260
    cfg = yaml.safe_load((engine / "eagle_config.yaml").read_text())
    assert cfg["draft"] == {"kind": "model"} and cfg["eagle_architecture"] is None


def test_build_refuses_a_config_for_another_drafter(ckpt, tmp_path):
    r = cli.invoke(app, ["build", "-c", str(config_file(tmp_path, ckpt, "draft: {kind: eagle3}\n")), "--dry-run"])
    assert one_line_error(r).startswith("Error: draft.kind is 'eagle3' but the draft in ")
    arch = ("eagle_architecture: {hidden_size: 64, num_attention_heads: 4, intermediate_size: 128, "
            "num_hidden_layers: 1, max_position_embeddings: 1024}\n")
    r = cli.invoke(app, ["build", "-c", str(config_file(tmp_path, ckpt, arch)), "--dry-run"])
    assert "eagle_architecture describes an EAGLE-3 head, but the checkpoint's draft is a model" in one_line_error(r)
    with pytest.raises(ValueError, match="eagle_architecture describes an EAGLE-3 head, but draft.kind is 'model'"):
        EagleConfig.model_validate({"draft": {"kind": "model"}, "eagle_architecture": yaml.safe_load(arch)[
            "eagle_architecture"]})


def test_build_checks_a_hand_assembled_pair(ckpt, tmp_path):
    bad = tmp_path / "ckpt"
    shutil.copytree(ckpt, bad)
    cfg = json.loads((bad / "draft" / "tokenizer_config.json").read_text())
    (bad / "draft" / "tokenizer_config.json").write_text(json.dumps({**cfg, "bos_token": "<unk>"}))
    r = cli.invoke(app, ["build", "-c", str(config_file(tmp_path, bad)), "--dry-run"])
    assert one_line_error(r).endswith("does not share the target's tokenizer: the bos token is '<s>' in the target's "
                                      "tokenizer and '<unk>' in the draft's")


def test_build_checks_the_draft_context(ckpt, tmp_path):
    bad = tmp_path / "ckpt"
    shutil.copytree(ckpt, bad)
    cfg = json.loads((bad / "draft" / "config.json").read_text())
    (bad / "draft" / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 128}))
    r = cli.invoke(app, ["build", "-c", str(config_file(tmp_path, bad)), "--dry-run"])
    assert "exceeds max_position_embeddings (128) of the draft model" in one_line_error(r)


# ---- run, bench, tune -------------------------------------------------------------------------------

@pytest.fixture
def counted_clock(monkeypatch):
    """EAGLE_TRT_CLOCK=tick: every decision on counted readings, and no step budget (which would weigh the tiny
    draft model's cost against the tiny target's on this machine's load): the drafts these tests check are made."""
    monkeypatch.setenv("EAGLE_TRT_CLOCK", "tick")


def test_run_equals_ar_and_names_the_drafter(engine, counted_clock):
    outs = {}
    for mode in ("eagle", "ar"):
        r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hello there", "--max-new-tokens", "40",
                             "--mode", mode, "--json"])
        assert r.exit_code == 0, r.output
        outs[mode] = json.loads(r.stdout)
    assert outs["eagle"]["token_ids"] == outs["ar"]["token_ids"]
    assert outs["eagle"]["metrics"]["drafter"] == "model" and outs["eagle"]["metrics"]["acceptance_length"] > 1
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", "hello", "--temperature", "0.8", "--seed", "3",
                         "--tree", "chain"])
    assert r.exit_code == 0 and "draft-model decoding, T=0.8" in r.stdout


def test_bench_draft_model_methods_and_hf_assistant(engine, tmp_path, counted_clock):
    from eagle_trt.bench.harness import bench_engine

    res = bench_engine(engine, "chat", limit=2, max_new_tokens=16, repeats=1, machine=False, plots=False,
                       methods=["hf", "hf-assisted", "ar", "draft-model-chain", "draft-model", "draft-model-lookup"])
    # The tiny engine takes 64 prompt tokens: the longer chat prompts are cut, and said so.
    assert res["failures"] == [] and {w["kind"] for w in res["warnings"]} <= {"truncated_prompt"}
    assert res["methods"]["hf-assisted"]["assistant_model"] == "the engine's draft model"
    assert res["summary"]["draft-model-chain"]["acceptance_length"] > 1
    r = cli.invoke(app, ["bench", "--engine", str(engine), "--methods", "tree", "--limit", "1", "-o",
                         str(tmp_path / "b")])
    assert one_line_error(r) == ("Error: --methods: tree needs another drafter; this engine drafts with a draft model: "
                                 "use draft-model-chain, draft-model, draft-model-lookup, draft-model-untuned")


def test_tune_covers_the_draft_model_tree(engine, tmp_path):
    tuned = tmp_path / "engine"
    shutil.copytree(engine, tuned)
    r = cli.invoke(app, ["tune", "--engine", str(tuned), "--limit", "1", "--max-new-tokens", "16", "--beams", "1,2",
                         "--max-depth", "4", "--validate", "1", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["stored"] and data["validation"]["mismatches"] == []
    stored = json.loads((tuned / "tuned.json").read_text())
    assert stored["beam_width"] in (1, 2, 4) and 1 <= stored["draft_length"] <= 4


# ---- TensorRT-LLM ----------------------------------------------------------------------------------

def trt_cfg(ckpt, **changes) -> EagleConfig:
    base = dict(name="tiny-dm", backend="trtllm", dtype="bfloat16", max_input_len=512, max_output_len=256,
                draft_length=4, total_tokens=16, beam_width=4, lookup_tokens=0)  # fmt: skip
    return EagleConfig(**{**base, **changes})


@pytest.mark.parametrize("line", list(LINES))
@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_trtllm_bundle_is_draft_target_of_the_line(ckpt, tmp_path, line, tree):
    summary = build_engine(trt_cfg(ckpt, trtllm_version=line, tree=tree), ckpt, tmp_path / "e")
    root = summary.engine_dir
    doc = yaml.safe_load((root / "extra_llm_api_options.yaml").read_text())
    spec = doc["speculative_config"]
    assert spec == {"decoding_type": "Draft_Target", "max_draft_len": 4, "speculative_model": "./draft"}
    assert contract_violations(doc, line) == []
    assert CONTRACTS[line]["extracted"]["classes"]["DraftTargetDecodingConfig"]["tags"] == {
        "decoding_type": "Draft_Target"}
    assert set(spec) <= line_fields(line, "DraftTargetDecodingConfig") and LINES[line].draft_target_fields <= \
        line_fields(line, "DraftTargetDecodingConfig")
    assert CONTRACTS[line]["behaviour"]["draft_target_runs_trees"] is False
    assert doc["max_num_tokens"] >= 4 + 1
    meta = json.loads((root / "trtllm.json").read_text())
    assert (meta["drafter"], meta["decoding_type"], meta["tree"]) == ("model", "Draft_Target", "chain")
    chain = [w for w in summary.warnings if "runs a draft model (Draft_Target) as a chain" in w]
    assert bool(chain) is (tree != "chain")
    draft = {p.name for p in (root / "draft").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= draft
    assert json.loads((root / "draft" / "config.json").read_text())["dtype"] == "bfloat16"


def test_trtllm_static_tree_is_a_chain_for_a_draft_model(ckpt, tmp_path):
    cfg = trt_cfg(ckpt, tree="static", static_tree=[[0], [1], [0, 0]])  # refused for an EAGLE-3 head on 1.3+
    summary = build_engine(cfg, ckpt, tmp_path / "e", dry_run=True)
    assert summary.validated and any("Draft_Target" in w for w in summary.warnings)


@pytest.fixture(params=list(LINES))
def fake_trtllm(request, monkeypatch):
    line = request.param
    mod, api = fake_modules(line)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", mod)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", api)
    monkeypatch.setattr(trtllm_backend, "installed_version", lambda: VERSIONS[line])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    FakeLLM.made = []
    return line


def test_trtllm_build_and_run_through_draft_target_config(ckpt, tmp_path, fake_trtllm):
    summary = build_engine(trt_cfg(ckpt, trtllm_version=fake_trtllm, tree="chain"), ckpt, tmp_path / "e")
    assert summary.trtllm["validated"] is True
    (llm,) = FakeLLM.made
    spec = llm.kwargs["speculative_config"]
    assert type(spec).__name__ == "DraftTargetDecodingConfig" and Path(spec.speculative_model).is_absolute()
    r = cli.invoke(app, ["run", "--engine", str(summary.engine_dir), "--prompt", "hi", "--no-chat", "--json",
                         "--draft-length", "3", "--max-new-tokens", "3"])
    assert r.exit_code == 0, r.output
    run_spec = FakeLLM.made[-1].kwargs["speculative_config"]
    assert (type(run_spec).__name__, run_spec.max_draft_len) == ("DraftTargetDecodingConfig", 3)
    assert json.loads(r.stdout)["metrics"]["drafter"] == "model"
    r = cli.invoke(app, ["run", "--engine", str(summary.engine_dir), "--prompt", "hi", "--posterior-threshold", "0.1"])
    assert one_line_error(r) == ("Error: --posterior-threshold: TensorRT-LLM's Draft_Target has no typical "
                                 "acceptance; leave it out for lossless acceptance")


def test_run_time_options_of_a_draft_target_bundle_stay_in_the_line(ckpt, tmp_path):
    for line in LINES:
        cfg = trt_cfg(ckpt, trtllm_version=line)
        options = trtllm_bundle.llm_api_options(cfg, [], "model")
        root = tmp_path / line.replace("+", "")
        root.mkdir()
        (root / "trtllm.json").write_text(json.dumps(trtllm_bundle.bundle_meta(cfg, options)))
        runner = trtllm_runner.TrtllmRunner(root, options)
        opts = types.SimpleNamespace(mode="eagle", tree="dynamic", draft_length=5, beam_width=4, total_tokens=12,
                                     static_tree=None, temperature=0.7, posterior_threshold=None)
        spec = runner._options_for(opts)[0]["speculative_config"]
        assert spec["decoding_type"] == "Draft_Target" and spec["max_draft_len"] == 5
        assert set(spec) <= line_fields(line, "DraftTargetDecodingConfig")


@pytest.mark.parametrize("line", list(LINES))
def test_trtllm_scripts_of_a_draft_target_bundle(ckpt, tmp_path, monkeypatch, line):
    """serve.sh hands TensorRT-LLM the draft model's absolute dir; validate.py builds DraftTargetDecodingConfig."""
    import os

    from test_trtllm_bundle_scripts import FAKE_TOOL, run_script, run_validate
    from trtllm_fakes import write_fake_packages

    root = build_engine(trt_cfg(ckpt, trtllm_version=line, tree="chain"), ckpt, tmp_path / "a b&c" / "e").engine_dir
    bin_dir, record = tmp_path / "bin", tmp_path / "record.json"
    bin_dir.mkdir()
    (bin_dir / "trtllm-serve").write_text(FAKE_TOOL.replace("/usr/bin/env python3", sys.executable))
    (bin_dir / "trtllm-serve").chmod(0o755)
    out = run_script(root / "serve.sh", [], cwd=tmp_path, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                                               "FAKE_RECORD": str(record)})
    assert out.returncode == 0, out.stderr
    opts = yaml.safe_load(json.loads(record.read_text())["options_text"])
    assert opts["speculative_config"] == {"decoding_type": "Draft_Target", "max_draft_len": 4,
                                          "speculative_model": str(root / "draft")}
    done = run_validate(root, write_fake_packages(tmp_path, line), "--max-tokens", "4")
    assert done.returncode == 0, done.stdout + done.stderr
