"""The TensorRT-LLM side of an engine dir, as plain files: nothing here imports tensorrt_llm.

For an EAGLE-3 head (the LLM API's PyTorch backend):

    extra_llm_api_options.yaml   speculative_config (Eagle3), kv_cache_config, request limits
    serve.sh                     trtllm-serve on ./target with that YAML (executable)
    bench.sh                     trtllm-bench throughput with that YAML (executable)

For an EAGLE-1/2 head (TensorRT-LLM's legacy TensorRT-engine flow; the PyTorch backend runs
EAGLE-3 only):

    legacy_trt/config.json       EagleForCausalLM checkpoint config (max_draft_len, num_eagle_layers, ...)
    legacy_trt/trtllm_build.sh   weight conversion + the exact `trtllm-build --speculative_decoding_mode eagle`

Field names follow TensorRT-LLM TRTLLM_VERSION (see docs/trtllm.md for the mapping table and
tests/fixtures/trtllm_schema.json for the recorded schema). Paths inside the YAML are relative to
the engine dir (`./target`, `./draft`), so the scripts cd there first; this keeps an engine movable
and two builds of the same inputs byte-identical.

    >>> from eagle_trt.config import EagleConfig
    >>> check_trtllm_config(EagleConfig(dtype="bfloat16", tree="chain"))
    []
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from eagle_trt.errors import ConfigError

TRTLLM_VERSION = "1.2.1"  # the release whose LLM API field names the generated files use
OPTIONS_NAME = "extra_llm_api_options.yaml"
SERVE_NAME = "serve.sh"
BENCH_NAME = "bench.sh"
LEGACY_DIR = "legacy_trt"
TRTLLM_DTYPES = ("float16", "bfloat16")  # weight dtypes the TensorRT-LLM kernels serve
LEGACY_MAX_DRAFT = 256


def check_trtllm_config(cfg) -> list[str]:
    """Raise ConfigError for settings TensorRT-LLM cannot honour; return warnings for ones it ignores."""
    if cfg.dtype not in TRTLLM_DTYPES:
        raise ConfigError(
            f"dtype {cfg.dtype} is not supported by backend trtllm (use {' or '.join(TRTLLM_DTYPES)})"
        )
    kv = cfg.resolved_kv_cache_dtype
    if kv not in ("fp8", cfg.dtype):
        raise ConfigError(
            f"kv_cache_dtype {kv} is not supported by backend trtllm with dtype {cfg.dtype} "
            f"(use auto, {cfg.dtype} or fp8)"
        )
    if cfg.tree == "dynamic" and cfg.total_tokens > cfg.max_beam_width * cfg.draft_length:
        raise ConfigError(
            f"total_tokens ({cfg.total_tokens}) exceeds max_beam_width x draft_length "
            f"({cfg.max_beam_width} x {cfg.draft_length} = {cfg.max_beam_width * cfg.draft_length}): "
            "TensorRT-LLM's dynamic tree cannot hold that many draft tokens"
        )
    warnings = []
    if cfg.confidence_threshold > 0:
        warnings.append(
            f"confidence_threshold {cfg.confidence_threshold} has no TensorRT-LLM equivalent and is "
            "ignored by backend trtllm (output stays lossless; trees are just not pruned)"
        )
    if cfg.tree == "static":
        warnings.append("TensorRT-LLM marks static trees (eagle_choices) as under development")
    if cfg.lookup_tokens > 0:
        warnings.append(
            f"lookup_tokens {cfg.lookup_tokens}: prompt-lookup branches are a torch-engine feature; TensorRT-LLM "
            "verifies the EAGLE-3 tree without them (set lookup_tokens: 0 to silence this)"
        )
    return warnings


def check_trtllm_head(cfg, head_kind: str) -> None:
    """Limits that depend on the head: the legacy EAGLE-1/2 engine holds at most 256 draft tokens."""
    if head_kind == "eagle1" and cfg.total_tokens > LEGACY_MAX_DRAFT:
        raise ConfigError(
            f"total_tokens ({cfg.total_tokens}) exceeds {LEGACY_MAX_DRAFT}, the most draft tokens "
            "TensorRT-LLM's legacy EAGLE engine (max_draft_len) supports"
        )


def speculative_config(cfg, aux_layer_ids: list[int]) -> dict:
    """Eagle3DecodingConfig fields. Greedy acceptance only: the output equals plain greedy decoding."""
    spec: dict = {"decoding_type": "Eagle3", "max_draft_len": cfg.draft_length, "speculative_model": "./draft",
                  "eagle3_one_model": True, "greedy_sampling": True}  # fmt: skip
    if cfg.tree == "dynamic":
        spec.update(use_dynamic_tree=True, dynamic_tree_max_topK=cfg.max_beam_width,
                    max_total_draft_tokens=cfg.total_tokens)  # fmt: skip
    elif cfg.tree == "static":
        spec.update(max_draft_len=max(len(p) for p in cfg.static_tree),
                    max_total_draft_tokens=len(cfg.static_tree), eagle_choices=cfg.static_tree)  # fmt: skip
    if aux_layer_ids:  # TensorRT-LLM's default is modelopt's; the head's own ids always win
        spec["eagle3_layers_to_capture"] = sorted(aux_layer_ids)
    return spec


def llm_api_options(cfg, aux_layer_ids: list[int]) -> dict:
    """Everything extra_llm_api_options.yaml holds (TorchLlmArgs field names)."""
    spec = speculative_config(cfg, aux_layer_ids)
    tree_tokens = spec.get("max_total_draft_tokens", spec["max_draft_len"])
    return {
        "max_batch_size": cfg.max_batch_size,
        "max_input_len": cfg.max_input_len,
        "max_seq_len": cfg.max_input_len + cfg.max_output_len,
        # A whole prompt in one step, and a full batch of trees (+ the root token each) per step.
        "max_num_tokens": max(cfg.max_input_len, cfg.max_batch_size * (tree_tokens + 1)),
        "max_beam_width": 1,  # beam search; eagle-trt's max_beam_width is the tree's top-k
        "return_perf_metrics": True,
        "kv_cache_config": {"dtype": "fp8" if cfg.resolved_kv_cache_dtype == "fp8" else "auto"},
        "speculative_config": spec,
    }


def legacy_checkpoint_config(cfg, target: dict, draft: dict) -> dict:
    """TensorRT-LLM checkpoint config.json of an EagleForCausalLM (target + EAGLE-1/2 nets)."""
    quant = {"quant_algo": None, "kv_cache_quant_algo": "FP8" if cfg.resolved_kv_cache_dtype == "fp8" else None}
    vocab = target["vocab_size"]

    def llama(c: dict, architecture: str) -> dict:
        heads = c["num_attention_heads"]
        return {
            "architecture": architecture, "dtype": cfg.dtype, "logits_dtype": "float32",
            "num_hidden_layers": c["num_hidden_layers"], "num_attention_heads": heads,
            "hidden_size": c["hidden_size"], "intermediate_size": c["intermediate_size"],
            "num_key_value_heads": c.get("num_key_value_heads") or heads,
            "head_size": c.get("head_dim") or c["hidden_size"] // heads,
            "vocab_size": vocab, "position_embedding_type": "rope_gpt_neox",
            "max_position_embeddings": c.get("max_position_embeddings") or target["max_position_embeddings"],
            "hidden_act": c.get("hidden_act", "silu"), "rotary_base": float(c.get("rope_theta", 10000.0)),
            "rotary_scaling": c.get("rope_scaling"), "norm_epsilon": float(c.get("rms_norm_eps", 1e-6)),
            "quantization": dict(quant), "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        }  # fmt: skip

    out = llama(target, "EagleForCausalLM")
    # Legacy naming: max_draft_len counts every draft token of the tree, num_eagle_layers is its depth.
    out.update(max_draft_len=cfg.total_tokens, num_eagle_layers=cfg.draft_length,
               max_non_leaves_per_layer=cfg.max_beam_width, eagle_net_config=llama(draft, "LlamaForCausalLM"))
    return out


def trtllm_build_command(cfg) -> list[str]:
    """The trtllm-build call for the legacy checkpoint (run from legacy_trt/)."""
    tree = cfg.total_tokens
    return [
        "trtllm-build", "--checkpoint_dir", "ckpt", "--output_dir", "engine",
        "--gemm_plugin", cfg.dtype, "--use_paged_context_fmha", "enable",
        "--speculative_decoding_mode", "eagle", "--max_batch_size", str(cfg.max_batch_size),
        "--max_input_len", str(cfg.max_input_len), "--max_seq_len", str(cfg.max_input_len + cfg.max_output_len),
        "--max_num_tokens", str(max(cfg.max_input_len, cfg.max_batch_size * (tree + 1))),
    ]  # fmt: skip


def kv_scale_tensors(scales: dict, num_layers: int) -> dict:
    """modelopt's FP8-KV names for the target's scales, which TensorRT-LLM reads with hf_quant_config.json."""
    out = {}
    for i in range(num_layers):
        out[f"model.layers.{i}.self_attn.k_proj.k_scale"] = scales["target.k_scales"][i].reshape(()).clone()
        out[f"model.layers.{i}.self_attn.v_proj.v_scale"] = scales["target.v_scales"][i].reshape(()).clone()
    return out


HF_QUANT_CONFIG = {
    "producer": {"name": "eagle-trt"},
    "quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8"},  # KV only: weights stay as they are
}


def write_bundle(cfg, head_kind: str, aux_layer_ids: list[int], target: dict, draft: dict, root: Path) -> list[str]:
    """Write the TensorRT-LLM files into root; return their relative paths."""
    from eagle_trt import __version__

    header = f"# Generated by eagle-trt {__version__} for TensorRT-LLM {TRTLLM_VERSION} (engine '{cfg.name}').\n"
    if head_kind == "eagle1":
        (root / LEGACY_DIR).mkdir()
        conf = legacy_checkpoint_config(cfg, target, draft)
        (root / LEGACY_DIR / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
        _script(root / LEGACY_DIR / "trtllm_build.sh", header + _legacy_script(cfg))
        return [f"{LEGACY_DIR}/config.json", f"{LEGACY_DIR}/trtllm_build.sh"]
    options = llm_api_options(cfg, aux_layer_ids)
    text = yaml.safe_dump(options, sort_keys=False, default_flow_style=None)
    (root / OPTIONS_NAME).write_text(header + "# Paths are relative to the engine dir: run from there.\n" + text)
    _script(root / SERVE_NAME, header + _SERVE)
    _script(root / BENCH_NAME, header + _BENCH.replace("@NAME@", shlex.quote(cfg.name)))
    return [OPTIONS_NAME, SERVE_NAME, BENCH_NAME]


_STRICT = "set -euo pipefail\n"
_CD = 'cd "$(dirname "${BASH_SOURCE[0]}")"  # every path below is relative to this script\'s dir\n'
_SERVE = f"""# OpenAI-compatible server: ./serve.sh [more trtllm-serve options]; HOST and PORT override the address.
{_STRICT}{_CD}exec trtllm-serve ./target --tokenizer ./tokenizer --backend pytorch \\
    --host "${{HOST:-0.0.0.0}}" --port "${{PORT:-8000}}" \\
    --extra_llm_api_options {OPTIONS_NAME} "$@"
"""
_BENCH = f"""# Throughput benchmark: ./bench.sh DATASET.jsonl [more trtllm-bench throughput options]
# (make a dataset with TensorRT-LLM's benchmarks/cpp/prepare_dataset.py).
{_STRICT}dataset="$(realpath "${{1:?usage: bench.sh DATASET.jsonl [trtllm-bench throughput options]}}")"
shift
{_CD}exec trtllm-bench --model @NAME@ --model_path ./target throughput --backend pytorch \\
    --dataset "$dataset" --extra_llm_api_options {OPTIONS_NAME} "$@"
"""


def _legacy_script(cfg) -> str:
    args = ["--model_dir", "../target", "--eagle_model_dir", "../draft", "--output_dir", "ckpt", "--dtype", cfg.dtype,
            "--max_draft_len", str(cfg.total_tokens), "--num_eagle_layers", str(cfg.draft_length)]  # fmt: skip
    convert_text = 'python3 "$TRTLLM_EXAMPLES/eagle/convert_checkpoint.py" ' + shlex.join(args)
    return f"""# EAGLE-1/2 head -> TensorRT engine (TensorRT-LLM's legacy flow; its PyTorch backend runs EAGLE-3 only).
# 1. TensorRT-LLM's examples/eagle/convert_checkpoint.py writes the weights (set TRTLLM_EXAMPLES to
#    the examples/ dir of a TensorRT-LLM checkout); this dir's config.json (tree limits, KV dtype)
#    then replaces the one it writes.
# 2. trtllm-build compiles ./engine. Run it with TensorRT-LLM's examples/run.py --engine_dir engine.
{_STRICT}{_CD}: "${{TRTLLM_EXAMPLES:?set TRTLLM_EXAMPLES to the examples/ dir of a TensorRT-LLM checkout}}"
{convert_text}
cp config.json ckpt/config.json
{shlex.join(trtllm_build_command(cfg))}
"""


def _script(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body, encoding="utf-8")
    path.chmod(0o755)
