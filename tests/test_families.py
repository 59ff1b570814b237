"""Every family in eagle_trt.architectures end to end on a tiny random model made here: Qwen2 (q/k/v biases, tied or
untied embeddings, RoPE base 1e6), Qwen3 (q/k norms), Llama 3.x (rope_type llama3), Mistral (no sliding window) and
Gemma 3 (its layer, sliding windows shorter than the context) convert, build and run with eagle == ar == HF greedy;
a sliding window the runtime does not run, and a RoPE type it does not implement, are refused."""

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


@pytest.mark.parametrize("family, overrides", [
    ("qwen2", {}), ("qwen2", {"tie_word_embeddings": False}), ("mistral", {}), ("qwen3", {}), ("llama3", {}),
    ("gemma3", {}), ("gemma3", {"final_logit_softcapping": 3.0})],
    ids=["qwen2-tied", "qwen2-untied", "mistral", "qwen3", "llama3", "gemma3", "gemma3-softcap"])
def test_family_eagle_equals_ar_equals_hf(tmp_path_factory, tmp_path, family, overrides):
    model = make(tmp_path_factory, family, **overrides)
    engine = convert_and_build(model, tmp_path)
    cfg = json.loads((engine / "target" / "config.json").read_text())
    if family == "qwen2":
        assert cfg.get("tie_word_embeddings", False) == overrides.get("tie_word_embeddings", True)
    if family == "gemma3":  # the prompt and the output run past the window
        assert cfg["sliding_window"] < 11 + 24
    prompt, ar = run_ids(engine, "--mode", "ar")
    for tree in ("dynamic", "chain"):
        assert run_ids(engine, "--tree", tree)[1] == ar
    assert run_ids(engine, "--lookup-tokens", "4")[1] == ar
    assert ar == hf_greedy(model, prompt, 24)[: len(ar)]


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_bf16_engine_is_lossless(tmp_path_factory, tmp_path, family):
    engine = convert_and_build(make(tmp_path_factory, family), tmp_path, dtype="bfloat16")
    ar = run_ids(engine, "--mode", "ar")[1]
    assert run_ids(engine)[1] == ar and run_ids(engine, "--tree", "chain")[1] == ar


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_the_trtllm_bundle_where_its_line_runs_the_family(tmp_path_factory, tmp_path, family):
    """TensorRT-LLM's Qwen3 model class runs EAGLE-3 (the bundle is written); its Gemma 3 class does not (refused in
    one line naming where that was read)."""
    model = make(tmp_path_factory, family)
    r = cli.invoke(app, ["convert", str(model), "--output", str(tmp_path / "ckpt"), "--no-calibrate-kv"])
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: fam\nbackend: trtllm\ndtype: bfloat16\ncheckpoint_dir: {tmp_path / 'ckpt'}\n"
                   "max_input_len: 64\nmax_output_len: 64\n")
    r = cli.invoke(app, ["build", "-c", str(cfg), "-o", str(tmp_path / "engine")])
    if family == "qwen3":
        assert r.exit_code == 0, r.output
        assert (tmp_path / "engine" / "extra_llm_api_options.yaml").is_file()
    else:
        assert r.exit_code == 2
        assert "TensorRT-LLM runs no EAGLE-3 for Gemma 3 (text)" in r.stderr and "modeling_gemma3.py" in r.stderr


def test_inspect_names_the_family(tmp_path_factory, tmp_path):
    engine = convert_and_build(make(tmp_path_factory, "gemma3"), tmp_path)
    r = cli.invoke(app, ["inspect", str(engine), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["family"] == "Gemma 3 (text)"
    r = cli.invoke(app, ["inspect", str(engine)])
    assert "family: Gemma 3 (text) (Gemma3ForCausalLM)" in r.stdout


def test_a_short_sliding_window_is_refused(tmp_path_factory, tmp_path):
    model = make(tmp_path_factory, "mistral", sliding_window=16)
    r = cli.invoke(app, ["convert", str(model), "--output", str(tmp_path / "ckpt")])
    assert r.exit_code == 2 and "sliding_window 16 is shorter than max_position_embeddings 1024" in r.stderr


@pytest.mark.parametrize("rope", [dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=256),
                                  dict(rope_type="dynamic", factor=2.0)], ids=["yarn", "dynamic"])
def test_a_rope_type_the_runtime_lacks_is_refused(tmp_path_factory, tmp_path, rope):
    model = make(tmp_path_factory, "llama", rope_scaling=rope)
    r = cli.invoke(app, ["convert", str(model), "--output", str(tmp_path / "ckpt")])
    assert r.exit_code == 2
    assert f"rope_type '{rope['rope_type']}' is not supported (eagle-trt implements default, linear, llama3)" in r.stderr


def test_the_runtime_refuses_what_it_would_not_reproduce():
    """The runtime's own reading of a config (an engine's target/config.json) refuses the same, naming the field."""
    from eagle_trt.errors import CheckpointError
    from eagle_trt.models.spec import TargetSpec
    from make_tiny_model import TINY_CONFIG

    base = dict(TINY_CONFIG, architectures=["LlamaForCausalLM"])
    with pytest.raises(CheckpointError, match=r"rope_parameters rope_type 'longrope' is not supported"):
        TargetSpec.from_hf_config(dict(base, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}))
    gemma = dict(base, architectures=["Gemma3ForCausalLM"], sliding_window=8,
                 rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 8.0},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    with pytest.raises(CheckpointError, match=r"rope_parameters.full_attention rope_type 'yarn'"):
        TargetSpec.from_hf_config(gemma)
    with pytest.raises(CheckpointError, match="attn_logit_softcapping 50.0 is not supported"):
        TargetSpec.from_hf_config(dict(gemma, rope_parameters=None, attn_logit_softcapping=50.0))
    spec = TargetSpec.from_hf_config(dict(gemma, rope_parameters=None, rope_theta=1e6, rope_local_base_freq=1e4,
                                          query_pre_attn_scalar=64))
    assert spec.local_layers == (0, 1, 2, 3, 4, 6, 7) and spec.sliding_window == 8  # every 6th layer global
    assert (spec.rope_theta, spec.rope_local_theta, spec.attention_scale) == (1e6, 1e4, 0.125)


def test_one_list_of_families():
    from eagle_trt.architectures import BY_CLASS, BY_TYPE

    assert set(BY_TYPE) == {"llama", "qwen2", "qwen3", "mistral", "gemma3_text", "gemma3"}
    assert set(BY_CLASS) == {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                             "Gemma3ForCausalLM"}
