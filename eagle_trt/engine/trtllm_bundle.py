"""The TensorRT-LLM side of an engine dir, as plain files: nothing here imports tensorrt_llm.

A bundle is written for one TensorRT-LLM release line (`trtllm_version`, eagle_trt.engine.trtllm_lines)
and holds only fields that line defines. For an EAGLE-3 head or a draft model (the LLM API's PyTorch backend):

    extra_llm_api_options.yaml   speculative_config (Eagle3, or Draft_Target for a draft model, whose draft/ is then a
                                 complete HF model dir), kv_cache_config, request limits
    trtllm.json                  the line, the tree it runs, the served model name
    serve.sh, bench.sh           trtllm-serve / trtllm-bench from any directory (eagle_trt.engine.trtllm_scripts)
    validate.py                  spec == no-spec check that needs only TensorRT-LLM (eagle_trt.engine.trtllm_validate)

For an EAGLE-1/2 head (TensorRT-LLM 1.2's legacy TensorRT-engine flow, which later lines removed):

    legacy_trt/config.json       EagleForCausalLM checkpoint config (max_draft_len, num_eagle_layers, ...)
    legacy_trt/trtllm_build.sh   weight conversion + the exact `trtllm-build --speculative_decoding_mode eagle`

Paths inside the YAML are relative to the engine dir (`./draft`), so two builds of the same inputs
are byte-identical; the scripts hand TensorRT-LLM absolute paths (see docs/trtllm.md).

    >>> from eagle_trt.config import EagleConfig
    >>> check_trtllm_config(EagleConfig(dtype="bfloat16", tree="chain"))
    []
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import yaml

from eagle_trt import __version__
from eagle_trt.architectures import BY_CLASS
from eagle_trt.engine import trtllm_hf_files, trtllm_scripts
from eagle_trt.engine.trtllm_lines import LINES, Line, accepted_releases
from eagle_trt.errors import ConfigError

OPTIONS_NAME = trtllm_scripts.OPTIONS_NAME
META_NAME = "trtllm.json"
SERVE_NAME = "serve.sh"
BENCH_NAME = "bench.sh"
VALIDATE_NAME = "validate.py"
LEGACY_DIR = "legacy_trt"
TRTLLM_DTYPES = ("float16", "bfloat16")  # weight dtypes the TensorRT-LLM kernels serve
LEGACY_MAX_DRAFT = 256
_DRAFT_REF = "./draft"  # the YAML's draft path; the scripts replace this exact text with an absolute path
DRAFT_TARGET = "Draft_Target"  # DraftTargetDecodingConfig's decoding_type in both lines


draft_tensor_names = trtllm_hf_files.draft_tensor_names


def line_of(cfg) -> Line:
    return LINES[cfg.trtllm_version]


def runs_tree(cfg) -> bool:
    """Whether the bundle's line will draft a tree for this config (else a chain of draft_length)."""
    return cfg.tree != "chain" and line_of(cfg).runs_trees


def check_trtllm_config(cfg) -> list[str]:
    """Raise ConfigError for settings TensorRT-LLM cannot honour whatever drafts; return warnings for ones it ignores.
    The tree rules depend on the drafter: `check_trtllm_head`, once the checkpoint says what drafts."""
    cfg = cfg.with_dtype(lambda: True)  # dtype auto is bfloat16 for TensorRT-LLM
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
    warnings = []
    if cfg.confidence_threshold > 0:
        warnings.append(
            f"confidence_threshold {cfg.confidence_threshold} has no TensorRT-LLM equivalent and is "
            "ignored by backend trtllm (output stays lossless; trees are just not pruned)"
        )
    if cfg.lookup_tokens > 0:
        warnings.append(
            f"lookup_tokens {cfg.lookup_tokens}: prompt-lookup branches are a torch-engine feature; TensorRT-LLM "
            "verifies the drafted tokens without them (set lookup_tokens: 0 to silence this)"
        )
    return warnings


def check_trtllm_family(target_architecture: str, head_kind: str) -> None:
    """Refuse an EAGLE head for a target whose TensorRT-LLM model class does not run EAGLE-3 (architectures.py
    records, per family, where in TensorRT-LLM's source that was read). A draft model drafts for any target."""
    family = BY_CLASS.get(target_architecture)
    if head_kind != "model" and family is not None and not family.trtllm_eagle3:
        raise ConfigError(f"backend trtllm: TensorRT-LLM runs no EAGLE-3 for {family.label} ({family.trtllm_source}); "
                          "build this engine with backend: torch")


def check_trtllm_head(cfg, head_kind: str) -> list[str]:
    """The rules that depend on what drafts; returns warnings. EAGLE-3: the line's trees. A draft model: TensorRT-LLM's
    Draft_Target drafts a chain on both lines. EAGLE-1/2: 1.2's legacy engine flow, at most 256 draft tokens."""
    line = line_of(cfg)
    if head_kind == "model":
        if cfg.tree == "chain":
            return []
        return [f"{line.releases} runs a draft model (Draft_Target) as a chain of max_draft_len = draft_length "
                f"({cfg.draft_length}) tokens per step: tree {cfg.tree} (total_tokens, beam_width) is not in "
                "this bundle"]
    if head_kind != "eagle1":
        return _eagle3_tree_rules(cfg, line)

    if not line.legacy_engine_flow:
        raise ConfigError(
            f"this EAGLE-1/2 head needs TensorRT-LLM's legacy TensorRT-engine flow, which {line.releases} no "
            'longer have: build it with trtllm_version "1.2" (--trtllm-version 1.2), or train an EAGLE-3 head'
        )
    if cfg.total_tokens > LEGACY_MAX_DRAFT:
        raise ConfigError(
            f"total_tokens ({cfg.total_tokens}) exceeds {LEGACY_MAX_DRAFT}, the most draft tokens "
            "TensorRT-LLM's legacy EAGLE engine (max_draft_len) supports"
        )
    return []


def check_trtllm_parallel(cfg, target: dict, draft: dict | None) -> list[str]:
    """Raise ConfigError for a tensor / pipeline split TensorRT-LLM cannot make of these models; returns warnings.
    Tensor parallelism splits every attention layer by heads (target and draft alike, one mapping for both) and
    replicates KV heads when there are fewer than GPUs, so the heads must divide evenly; pipeline parallelism gives
    each stage at least one of the target's layers."""
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    for which, conf in (("target", target), ("draft", draft or {})):
        heads = int(conf.get("num_attention_heads") or 0)
        kv = int(conf.get("num_key_value_heads") or heads)
        if heads and heads % tp:
            raise ConfigError(f"tensor_parallel_size {tp} does not divide the {which}'s num_attention_heads ({heads}): "
                              f"use a divisor of {heads}")  # fmt: skip
        if kv and kv % tp and tp % kv:
            raise ConfigError(f"tensor_parallel_size {tp} and the {which}'s num_key_value_heads ({kv}) do not divide "
                              "one another: TensorRT-LLM splits or replicates KV heads evenly")  # fmt: skip
    layers = int(target.get("num_hidden_layers") or 0)
    if layers and pp > layers:
        raise ConfigError(f"pipeline_parallel_size {pp} exceeds the target's {layers} layers: each stage needs one")
    if tp * pp > 1 and cfg.max_batch_size == 1:
        return [f"{tp * pp} GPUs (tensor {tp} x pipeline {pp}) serving max_batch_size 1: one request at a time; "
                "raise max_batch_size for a served bundle (see docs/trtllm.md, Deploying on several GPUs)"]
    return []


def _eagle3_tree_rules(cfg, line: Line) -> list[str]:
    if cfg.tree == "static" and line.runs_trees:
        raise ConfigError(
            f'tree static: {line.releases} do not all have static trees (eagle_choices is gone by 1.4.0rc1); use '
            'tree: dynamic or chain, or build for trtllm_version "1.2", which runs a chain'
        )
    if runs_tree(cfg) and cfg.total_tokens > cfg.beam_width * cfg.draft_length:
        raise ConfigError(
            f"total_tokens ({cfg.total_tokens}) exceeds beam_width x draft_length "
            f"({cfg.beam_width} x {cfg.draft_length} = {cfg.beam_width * cfg.draft_length}): "
            "TensorRT-LLM's dynamic tree cannot hold that many draft tokens"
        )
    if cfg.tree != "chain" and not line.runs_trees:
        return [f"{line.releases} runs EAGLE-3 as a chain of max_draft_len = draft_length ({cfg.draft_length}) "
                f"tokens per step: tree {cfg.tree} (total_tokens, beam_width) is not in this bundle; "
                'trtllm_version "1.3+" runs dynamic trees']
    return []


def speculative_config(cfg, aux_layer_ids: list[int], head_kind: str = "eagle3") -> dict:
    """Eagle3DecodingConfig fields of the config's line, or DraftTargetDecodingConfig's for a draft model (a chain of
    draft_length tokens). Greedy acceptance: the output equals plain greedy decoding."""
    if head_kind == "model":
        spec = {"decoding_type": DRAFT_TARGET, "max_draft_len": cfg.draft_length, "speculative_model": _DRAFT_REF}
        extra = set(spec) - line_of(cfg).draft_target_fields
        assert not extra, f"fields outside line {cfg.trtllm_version}: {extra}"  # an invariant of this module
        return spec
    spec: dict = {"decoding_type": "Eagle3", "max_draft_len": cfg.draft_length, "speculative_model": _DRAFT_REF}
    if runs_tree(cfg):  # dynamic: static trees were refused for lines that run trees
        spec.update(use_dynamic_tree=True, dynamic_tree_max_topK=cfg.beam_width,
                    max_total_draft_tokens=cfg.total_tokens)  # fmt: skip
    if aux_layer_ids:  # TensorRT-LLM's default is modelopt's; the head's own ids always win
        spec["eagle3_layers_to_capture"] = sorted(aux_layer_ids)
    extra = set(spec) - line_of(cfg).speculative_fields
    assert not extra, f"fields outside line {cfg.trtllm_version}: {extra}"  # an invariant of this module
    return spec


def llm_api_options(cfg, aux_layer_ids: list[int], head_kind: str = "eagle3") -> dict:
    """Everything extra_llm_api_options.yaml holds (TorchLlmArgs field names of the line)."""
    spec = speculative_config(cfg, aux_layer_ids, head_kind)
    tree_tokens = spec.get("max_total_draft_tokens", spec["max_draft_len"])
    return {
        "max_batch_size": cfg.max_batch_size,
        # GPUs: tensor x pipeline; trtllm-serve starts one worker per GPU on this node (check_trtllm_parallel).
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "max_input_len": cfg.max_input_len,
        "max_seq_len": cfg.max_input_len + cfg.max_output_len,
        # A whole prompt in one step, and a full batch of trees (+ the root token each) per step.
        "max_num_tokens": max(cfg.max_input_len, cfg.max_batch_size * (tree_tokens + 1)),
        "max_beam_width": 1,  # beam search; eagle-trt's max_beam_width is the tree's top-k
        "return_perf_metrics": True,
        "kv_cache_config": {"dtype": "fp8" if cfg.resolved_kv_cache_dtype == "fp8" else "auto"},
        "speculative_config": spec,
    }


def bundle_meta(cfg, options: dict) -> dict:
    """trtllm.json: what the bundle is for, read by validate.py, `inspect` and `run`."""
    line, spec = line_of(cfg), options["speculative_config"]
    return {
        "eagle_trt": __version__, "name": cfg.name, "trtllm_version": line.name, "releases": line.releases,
        "drafter": "model" if spec["decoding_type"] == DRAFT_TARGET else "eagle3",
        "decoding_type": spec["decoding_type"],
        "tree": "dynamic" if spec.get("use_dynamic_tree") else "chain", "max_draft_len": spec["max_draft_len"],
        "max_total_draft_tokens": spec.get("max_total_draft_tokens", spec["max_draft_len"]),
        "served_model_name": cfg.name, "transformers_pin": line.transformers_pin,
        # The releases of each line (from inclusive, before exclusive): validate.py tells the installed one's line.
        "lines": accepted_releases(),
        "tensor_parallel_size": options["tensor_parallel_size"], "pipeline_parallel_size": options["pipeline_parallel_size"],
    }  # fmt: skip


def read_meta(root: Path) -> dict | None:
    path = Path(root) / META_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


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
            "quantization": dict(quant),
            "mapping": {"world_size": cfg.tensor_parallel_size * cfg.pipeline_parallel_size,
                        "tp_size": cfg.tensor_parallel_size, "pp_size": cfg.pipeline_parallel_size},
        }  # fmt: skip

    out = llama(target, "EagleForCausalLM")
    # Legacy naming: max_draft_len counts every draft token of the tree, num_eagle_layers is its depth.
    out.update(max_draft_len=cfg.total_tokens, num_eagle_layers=cfg.draft_length,
               max_non_leaves_per_layer=cfg.beam_width, eagle_net_config=llama(draft, "LlamaForCausalLM"))
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
    """Write the TensorRT-LLM files into root (the build's temp dir); return their relative paths."""
    line = line_of(cfg)
    header = (f"# Generated by eagle-trt {__version__} for {line.releases} "
              f"(trtllm_version {line.name}, engine '{cfg.name}').\n")  # fmt: skip
    if head_kind == "model":  # TensorRT-LLM loads a draft model as a complete HF model dir
        for src in sorted((root / "tokenizer").iterdir()):
            shutil.copyfile(src, root / "draft" / src.name)
    trtllm_hf_files.rewrite_dir(root)
    if head_kind == "eagle1":
        (root / LEGACY_DIR).mkdir()
        conf = legacy_checkpoint_config(cfg, target, draft)
        (root / LEGACY_DIR / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
        _script(root / LEGACY_DIR / "trtllm_build.sh", "#!/usr/bin/env bash\n" + header + _legacy_script(cfg))
        return [f"{LEGACY_DIR}/config.json", f"{LEGACY_DIR}/trtllm_build.sh"]
    options = llm_api_options(cfg, aux_layer_ids, head_kind)
    text = yaml.safe_dump(options, sort_keys=False, default_flow_style=None)
    # The scripts rewrite exactly this text (a block line, or the last item of a flow mapping of scalars).
    if f"speculative_model: {_DRAFT_REF}\n" not in text and f"speculative_model: {_DRAFT_REF}}}\n" not in text:
        raise AssertionError(f"unexpected YAML for speculative_model: {text!r}")
    (root / OPTIONS_NAME).write_text(header + "# speculative_model is relative to this file's dir; serve.sh, bench.sh "
                                     "and validate.py make it absolute.\n" + text)  # fmt: skip
    (root / META_NAME).write_text(json.dumps(bundle_meta(cfg, options), indent=2, sort_keys=True) + "\n")
    _script(root / SERVE_NAME, trtllm_scripts.serve_script(cfg.name, header))
    _script(root / BENCH_NAME, trtllm_scripts.bench_script(cfg.name, header))
    shutil.copyfile(Path(__file__).with_name("trtllm_validate.py"), root / VALIDATE_NAME)
    (root / VALIDATE_NAME).chmod(0o755)
    return [OPTIONS_NAME, META_NAME, SERVE_NAME, BENCH_NAME, VALIDATE_NAME]


_STRICT = "set -euo pipefail\n"
_CD = 'cd "$(dirname "${BASH_SOURCE[0]}")"  # every path below is relative to this script\'s dir\n'


def _legacy_script(cfg) -> str:
    args = ["--model_dir", "../target", "--eagle_model_dir", "../draft", "--output_dir", "ckpt", "--dtype", cfg.dtype,
            "--max_draft_len", str(cfg.total_tokens), "--num_eagle_layers", str(cfg.draft_length),
            "--tp_size", str(cfg.tensor_parallel_size), "--pp_size", str(cfg.pipeline_parallel_size)]  # fmt: skip
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


def _script(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
