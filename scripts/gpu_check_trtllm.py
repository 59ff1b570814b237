"""End-to-end check of the trtllm backend on a machine with an NVIDIA GPU and TensorRT-LLM.

    pip install -e '.[trtllm]'                 # Linux x86-64/aarch64, Python 3.10 or 3.12, CUDA
    python scripts/gpu_check_trtllm.py         # tiny random Llama, about 5 minutes
    python scripts/gpu_check_trtllm.py --checkpoint checkpoints/smollm2-135m-instruct --strict-lossless

Checks, each reported as PASS/FAIL/WARN with one line of detail, then a JSON summary (--json-out):
  schema      every field eagle-trt writes exists in the installed TensorRT-LLM (Eagle3DecodingConfig,
              KvCacheConfig, TorchLlmArgs; tests/fixtures/trtllm_schema.json records the expected set)
  cli         trtllm-serve / trtllm-bench / trtllm-build --help list the options the scripts use
  build       `build_engine(backend=trtllm)` writes the bundle and loads it through LLM(...)
  run         eagle-trt's Session generates through the LLM API and reports TensorRT-LLM's metrics
  lossless    greedy EAGLE-3 output equals greedy output without speculation (WARN, or FAIL with
              --strict-lossless: random tiny models have near-tied logits that bf16 can flip)
Exit code: 0 all passed, 1 a check failed, 3 no TensorRT-LLM or no GPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

RESULTS: list[dict] = []


def report(name: str, status: str, detail: str) -> None:
    RESULTS.append({"check": name, "status": status, "detail": detail})
    print(f"[{status}] {name}: {detail}", flush=True)


def check_schema() -> None:
    from tensorrt_llm.llmapi import Eagle3DecodingConfig, KvCacheConfig, TorchLlmArgs

    fixture = json.loads((REPO / "tests" / "fixtures" / "trtllm_schema.json").read_text())
    api = fixture["llm_api"]
    missing = []
    for name, cls in (("Eagle3DecodingConfig", Eagle3DecodingConfig), ("KvCacheConfig", KvCacheConfig),
                      ("TorchLlmArgs", TorchLlmArgs)):  # fmt: skip
        fields = set(cls.model_fields)
        for info in cls.model_fields.values():  # validation aliases count as names too
            choices = getattr(getattr(info, "validation_alias", None), "choices", None) or []
            fields |= {c for c in choices if isinstance(c, str)}
        missing += [f"{name}.{f}" for f in api[name]["fields"] if f not in fields]
    import tensorrt_llm

    used = {"decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model", "eagle3_one_model",
            "greedy_sampling", "use_dynamic_tree", "dynamic_tree_max_topK", "eagle_choices", "eagle3_layers_to_capture",
            "dtype", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width",
            "return_perf_metrics", "kv_cache_config", "speculative_config"}  # fmt: skip
    broken = [m for m in missing if m.split(".")[1] in used]
    detail = (f"tensorrt_llm {tensorrt_llm.__version__} vs fixture {fixture['tensorrt_llm_version']}; "
              f"missing: {missing or 'none'}")  # fmt: skip
    report("schema", "FAIL" if broken else ("WARN" if missing else "PASS"), detail)


def check_cli() -> None:
    fixture = json.loads((REPO / "tests" / "fixtures" / "trtllm_schema.json").read_text())["cli"]
    wanted = {"trtllm-serve": (["trtllm-serve", "serve", "--help"], fixture["trtllm-serve"]["options"]),
              "trtllm-bench": (["trtllm-bench", "--model", "x", "throughput", "--help"],
                               fixture["trtllm-bench"]["subcommand_options"]),
              "trtllm-build": (["trtllm-build", "--help"], fixture["trtllm-build"]["options"])}  # fmt: skip
    for tool, (cmd, options) in wanted.items():
        if shutil.which(tool) is None:
            report(f"cli {tool}", "FAIL", "not on PATH")
            continue
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        text = out.stdout + out.stderr
        if "No such command" in text and tool == "trtllm-serve":  # older releases: no `serve` subcommand
            text = subprocess.run(cmd[:1] + ["--help"], capture_output=True, text=True, timeout=300).stdout
        absent = [o for o in options if o not in text]
        report(f"cli {tool}", "FAIL" if absent else "PASS", f"options absent from --help: {absent or 'none'}")


def make_checkpoint(work: Path, kv_fp8: bool) -> Path:
    """Tiny Llama with TensorRT-LLM-friendly head_dim 64, plus an untrained EAGLE-3 head via convert."""
    import torch
    from make_tiny_model import make_tiny_model
    from safetensors.torch import save_file

    from eagle_trt.convert import convert_model

    model = make_tiny_model(work / "tiny", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=64, num_hidden_layers=8)  # fmt: skip
    ckpt = work / "ckpt"
    convert_model(model, ckpt, steps=0, progress=False, overwrite=True)
    if kv_fp8:
        layers = json.loads((ckpt / "target" / "config.json").read_text())["num_hidden_layers"]
        save_file({"target.k_scales": torch.full((layers,), 0.05), "target.v_scales": torch.full((layers,), 0.05),
                   "draft.k_scales": torch.full((1,), 0.05), "draft.v_scales": torch.full((1,), 0.05)},
                  str(ckpt / "kv_scales.safetensors"))  # fmt: skip
    return ckpt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, help="`eagle-trt convert` output (default: a tiny random one)")
    ap.add_argument("--workdir", type=Path, help="where engines go (default: a temp dir)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--kv-cache-dtype", default="fp8", choices=["fp8", "auto"])
    ap.add_argument("--tree", default="chain", choices=["chain", "dynamic"])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--strict-lossless", action="store_true")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    from eagle_trt.engine.trtllm_backend import require_cuda, require_tensorrt_llm
    from eagle_trt.errors import MissingDependencyError

    try:
        trt = require_tensorrt_llm()
        require_cuda()
    except MissingDependencyError as exc:
        print(f"cannot run: {exc.message} (hint: {exc.hint})")
        return 3
    import torch

    report("env", "PASS", f"tensorrt_llm {trt.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    check_schema()
    check_cli()

    from eagle_trt.config import EagleConfig
    from eagle_trt.engine.builder import build_engine
    from eagle_trt.runtime.session import Session

    work = args.workdir or Path(tempfile.mkdtemp(prefix="eagle-trt-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = args.checkpoint or make_checkpoint(work, args.kv_cache_dtype == "fp8")
    positions = json.loads((ckpt / "target" / "config.json").read_text())["max_position_embeddings"]
    cfg = EagleConfig(name="gpu-check", backend="trtllm", dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
                      tree=args.tree, draft_length=4, max_beam_width=4, total_tokens=16,
                      max_input_len=min(512, positions // 2), max_output_len=min(256, positions // 4))  # fmt: skip
    try:
        start = time.monotonic()
        summary = build_engine(cfg, ckpt, work / "engine")
        ok = summary.trtllm and summary.trtllm["validated"]
        report("build", "PASS" if ok else "FAIL",
               f"{summary.engine_dir} in {time.monotonic() - start:.0f}s; trtllm: {summary.trtllm}")
    except Exception as exc:  # noqa: BLE001 - a check script reports, it does not crash
        report("build", "FAIL", f"{type(exc).__name__}: {exc}")
        return finish(args)

    try:
        session = Session.open(summary.engine_dir)
        ids = session.encode("Write a haiku about the sea.", chat=True)
        outs = {}
        for mode in ("eagle", "ar"):
            opts = session.decode_options(mode=mode, max_new_tokens=args.max_new_tokens)
            result = session.runner.generate(ids, opts)
            outs[mode] = result.token_ids
            m = result.metrics.to_dict()
            report(f"run {mode}", "PASS" if result.token_ids else "FAIL",
                   f"{m['generated_tokens']} tokens, {m['tokens_per_second']} tok/s, acceptance length "
                   f"{m['acceptance_length']}, acceptance rate {m['acceptance_rate']}, ttft {m['prefill_ms']} ms")
        session.runner.close()
        same = outs["eagle"] == outs["ar"]
        report("lossless", "PASS" if same else ("FAIL" if args.strict_lossless else "WARN"),
               "EAGLE-3 greedy == plain greedy" if same else f"differ: {outs['eagle'][:12]} vs {outs['ar'][:12]}")
    except Exception as exc:  # noqa: BLE001
        report("run", "FAIL", f"{type(exc).__name__}: {exc}")
    return finish(args)


def finish(args) -> int:
    failed = [r for r in RESULTS if r["status"] == "FAIL"]
    summary = {"passed": not failed, "results": RESULTS}
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
