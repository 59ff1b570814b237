"""Every family in eagle_trt.architectures end to end on a tiny random model made here: Qwen2 (q/k/v biases, tied or
untied embeddings, RoPE base 1e6) and Mistral (no sliding window) convert, build and run with eagle == ar == HF greedy;
a sliding window shorter than the context is refused."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from eagle_trt.cli.app import app

cli = CliRunner()
PROMPT = "Hello there"


def make(tmp_path_factory, family: str, **overrides):
    from make_tiny_model import make_tiny_model

    name = family + "".join(f"-{k}" for k in overrides)
    return make_tiny_model(tmp_path_factory.mktemp(name) / "model", seed=4, family=family, **overrides)


def convert_and_build(model, tmp, dtype="float32"):
    r = cli.invoke(app, ["convert", str(model), "--output", str(tmp / "ckpt"), "--no-calibrate-kv"])
    assert r.exit_code == 0, r.output
    cfg = tmp / "cfg.yaml"
    cfg.write_text(f"name: fam\ncheckpoint_dir: {tmp / 'ckpt'}\ndtype: {dtype}\nmax_input_len: 64\n"
                   "max_output_len: 64\n")
    r = cli.invoke(app, ["build", "-c", str(cfg), "-o", str(tmp / "engine")])
    assert r.exit_code == 0, r.output
    return tmp / "engine"


def run_ids(engine, *args):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--prompt", PROMPT, "--max-new-tokens", "24", "--json",
                         *args])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    return out["prompt_token_ids"], out["token_ids"]


def hf_greedy(model_dir, prompt_ids, n):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("family, overrides", [("qwen2", {}), ("qwen2", {"tie_word_embeddings": False}),
                                               ("mistral", {})], ids=["qwen2-tied", "qwen2-untied", "mistral"])
def test_family_eagle_equals_ar_equals_hf(tmp_path_factory, tmp_path, family, overrides):
    model = make(tmp_path_factory, family, **overrides)
    engine = convert_and_build(model, tmp_path)
    cfg = json.loads((engine / "target" / "config.json").read_text())
    if family == "qwen2":
        assert cfg.get("tie_word_embeddings", False) == overrides.get("tie_word_embeddings", True)
    prompt, ar = run_ids(engine, "--mode", "ar")
    for tree in ("dynamic", "chain"):
        assert run_ids(engine, "--tree", tree)[1] == ar
    assert run_ids(engine, "--lookup-tokens", "4")[1] == ar
    assert ar == hf_greedy(model, prompt, 24)[: len(ar)]


def test_qwen2_bf16_engine_is_lossless(tmp_path_factory, tmp_path):
    engine = convert_and_build(make(tmp_path_factory, "qwen2"), tmp_path, dtype="bfloat16")
    ar = run_ids(engine, "--mode", "ar")[1]
    assert run_ids(engine)[1] == ar and run_ids(engine, "--tree", "chain")[1] == ar


def test_a_short_sliding_window_is_refused(tmp_path_factory, tmp_path):
    model = make(tmp_path_factory, "mistral", sliding_window=16)
    r = cli.invoke(app, ["convert", str(model), "--output", str(tmp_path / "ckpt")])
    assert r.exit_code == 2 and "sliding_window 16 is shorter than max_position_embeddings 1024" in r.stderr


def test_one_list_of_families():
    from eagle_trt.architectures import BY_CLASS, BY_TYPE

    assert set(BY_TYPE) == {"llama", "qwen2", "mistral"}
    assert set(BY_CLASS) == {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}
