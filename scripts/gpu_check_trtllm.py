"""GPU smoke check of the trtllm backend: tiny bundles built here, then run step by step where TensorRT-LLM is.

    python scripts/gpu_check_trtllm.py                            # build the bundles, run what this machine can
    python scripts/gpu_check_trtllm.py --workdir /tmp/smoke --json-out smoke.json
    python scripts/gpu_check_trtllm.py --strict-lossless          # a spec != no-spec output fails, not warns
    python scripts/gpu_check_trtllm.py --bundles-from /tmp/smoke  # GPU machine: run bundles built elsewhere

Steps, one PASS / FAIL / WARN / SKIP line each, each in its own time limit (all of them in 10 minutes):
  bundles   CPU (or --bundles-from: found in that dir). A tiny random Llama (8 layers, head_dim 64, a 260-token byte vocabulary) with a random
            EAGLE-3 head, built by `build_engine` into bundles for both TensorRT-LLM lines: 1.3+ as a chain
            and as a dynamic tree, 1.2 as a chain (its only shape), each with KV auto and fp8; and per line one
            bundle where a smaller random Llama with the same tokenizer drafts (Draft_Target). A few MB each.
  versions  Python, torch, CUDA and GPU, transformers, and tensorrt_llm imported in a subprocess.
            Without tensorrt_llm or a GPU the check stops here with exit code 3.
  config    Config only, no model load, the way trtllm-serve reads it: each bundle's YAML (its draft path made
            absolute, as serve.sh does) through TensorRT-LLM's update_llm_args_with_extra_options, whose
            DecodingBaseConfig.from_dict picks the decoding config by decoding_type, then TorchLlmArgs validation.
            A release that does not know decoding_type Eagle3 / Draft_Target fails here, even though its
            Eagle3DecodingConfig class could be built directly.
  serve     One bundle's own serve.sh (trtllm-serve on 127.0.0.1, a free port), polled until /health answers, one
            greedy /v1/completions under the engine's name, then stopped (SIGTERM, SIGKILL after 20 s). --no-serve
            skips it.
  generate  Per bundle of the installed line: its own validate.py in a subprocess (a real LLM load, 32 greedy
            tokens with and without speculation, acceptance per iteration). Unequal outputs are a WARN on these
            random models (bf16 near-ties), a FAIL with --strict-lossless.
Exit code: 0 no step failed, 1 a step failed, 3 no TensorRT-LLM or no GPU (the CPU steps ran and passed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

TINY = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            num_hidden_layers=8, max_position_embeddings=1024)  # fmt: skip
AUX = (1, 3, 4)  # modelopt's default for 8 layers: {1, L/2 - 1, L - 4}
VARIANTS = {"1.3+": [("chain", "auto"), ("chain", "fp8"), ("dynamic", "auto"), ("dynamic", "fp8")],
            "1.2": [("chain", "auto"), ("chain", "fp8")]}  # fmt: skip


class Check:
    """Step results, printed as they come and summed up at the end."""

    def __init__(self, budget_s: float):
        self.results: list[dict] = []
        self.deadline = time.monotonic() + budget_s

    def report(self, step: str, status: str, detail: str) -> None:
        self.results.append({"step": step, "status": status, "detail": detail})
        print(f"[{status}] {step}: {detail}", flush=True)

    def limit(self, step_s: float) -> float:
        """A step's timeout: its own limit, cut to what is left of the whole run's budget."""
        return max(1.0, min(step_s, self.deadline - time.monotonic()))

    @property
    def failed(self) -> bool:
        return any(r["status"] == "FAIL" for r in self.results)


def write_checkpoint(work: Path, seed: int = 0) -> Path:
    """target/ (tiny random Llama, HF format) + draft/ (random EAGLE-3 head in modelopt's layout) + KV scales."""
    import torch
    from make_tiny_model import make_tiny_model
    from safetensors.torch import save_file

    ckpt = work / "ckpt"
    # A wide init gives peaked logits, so bf16 rounding rarely flips a greedy choice between two runs.
    make_tiny_model(ckpt / "target", seed=seed, init_std=0.3, **TINY)
    h, heads, kv, hd, inter = (TINY[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                 "head_dim", "intermediate_size"))  # fmt: skip
    g = torch.Generator().manual_seed(seed + 1)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    p = "layers.0."
    head = {"fc.weight": r(h, len(AUX) * h), "norm.weight": 1 + r(h), p + "hidden_norm.weight": 1 + r(h),
            p + "input_layernorm.weight": 1 + r(h), p + "post_attention_layernorm.weight": 1 + r(h),
            p + "self_attn.q_proj.weight": r(heads * hd, 2 * h), p + "self_attn.k_proj.weight": r(kv * hd, 2 * h),
            p + "self_attn.v_proj.weight": r(kv * hd, 2 * h), p + "self_attn.o_proj.weight": r(h, heads * hd),
            p + "mlp.gate_proj.weight": r(inter, h), p + "mlp.up_proj.weight": r(inter, h),
            p + "mlp.down_proj.weight": r(h, inter)}  # fmt: skip
    (ckpt / "draft").mkdir(parents=True)
    save_file(head, str(ckpt / "draft" / "model.safetensors"))
    target = json.loads((ckpt / "target" / "config.json").read_text())
    draft = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
             "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "intermediate_size": inter,
             "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
             "rope_scaling": {"rope_type": "default", "rope_theta": 10000.0},
             "max_position_embeddings": TINY["max_position_embeddings"], "vocab_size": target["vocab_size"],
             "draft_vocab_size": target["vocab_size"], "eagle_aux_hidden_state_layer_ids": list(AUX)}  # fmt: skip
    (ckpt / "draft" / "config.json").write_text(json.dumps(draft, indent=2))
    layers = TINY["num_hidden_layers"]
    save_file({"target.k_scales": torch.full((layers,), 0.05), "target.v_scales": torch.full((layers,), 0.05),
               "draft.k_scales": torch.full((1,), 0.05), "draft.v_scales": torch.full((1,), 0.05)},
              str(ckpt / "kv_scales.safetensors"))  # fmt: skip
    return ckpt


def write_draft_model_checkpoint(work: Path, target_ckpt: Path, seed: int = 0) -> Path:
    """target/ as in write_checkpoint + draft/: a smaller random Llama (4 layers) with the same tokenizer."""
    import shutil

    from make_tiny_model import make_tiny_model

    ckpt = work / "ckpt-draft-model"
    shutil.copytree(target_ckpt / "target", ckpt / "target")
    make_tiny_model(ckpt / "draft", seed=seed + 2, init_std=0.3, **{**TINY, "num_hidden_layers": 4})
    return ckpt


def build_bundles(work: Path) -> dict[str, list[Path]]:
    from eagle_trt.config import EagleConfig
    from eagle_trt.engine.builder import build_engine

    ckpt = write_checkpoint(work)
    model_ckpt = write_draft_model_checkpoint(work, ckpt)
    out: dict[str, list[Path]] = {}
    for line, variants in VARIANTS.items():
        for tree, kv, name, source in [(t, k, f"smoke-{t}-{k}", ckpt) for t, k in variants] + [
                ("chain", "auto", "smoke-draftmodel-chain-auto", model_ckpt)]:
            cfg = EagleConfig(name=name, backend="trtllm", dtype="bfloat16", trtllm_version=line,
                              kv_cache_dtype=kv, tree=tree, draft_length=4, beam_width=4, total_tokens=10,
                              lookup_tokens=0, max_input_len=256, max_output_len=128)  # fmt: skip
            dest = work / "bundles" / line.replace("+", "plus") / cfg.name
            out.setdefault(line, []).append(build_engine(cfg, source, dest).engine_dir)
    return out


_PROBE = """
import json, sys
info = {"python": sys.version.split()[0]}
try:
    import torch
    info.update(torch=torch.__version__, cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0)
                if torch.cuda.is_available() else None)
except Exception as exc:
    info.update(torch=None, gpu=None, torch_error=f"{type(exc).__name__}: {exc}")
try:
    import transformers
    info["transformers"] = transformers.__version__
except Exception:
    info["transformers"] = None
try:
    import tensorrt_llm
    info["tensorrt_llm"] = getattr(tensorrt_llm, "__version__", "?") if hasattr(tensorrt_llm, "LLM") else None
except Exception as exc:
    info.update(tensorrt_llm=None, tensorrt_llm_error=f"{type(exc).__name__}: {exc}")
print(json.dumps(info))
"""

# The path trtllm-serve takes (tensorrt_llm/commands/serve.py): the YAML is read by
# tensorrt_llm.llmapi.llm_args.update_llm_args_with_extra_options, which builds speculative_config with
# DecodingBaseConfig.from_dict (dispatch on decoding_type: where a release does not know "Eagle3" or "Draft_Target",
# the rejection shows here), merges it over the command line's arguments, and LLM(...) validates the result as
# TorchLlmArgs. The same, without loading a model: the YAML copy names the draft absolutely, as serve.sh writes it.
_CONFIG = """
import json, sys, tempfile
from pathlib import Path
import yaml
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs, update_llm_args_with_extra_options
out = {}
for root in map(Path, sys.argv[1:]):
    text = (root / "extra_llm_api_options.yaml").read_text()
    text = text.replace("speculative_model: ./draft", "speculative_model: " + json.dumps(str(root / "draft")))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "extra_llm_api_options.yaml"
            path.write_text(text)
            base = {"model": str(root / "target"), "tokenizer": str(root / "tokenizer"), "backend": "pytorch"}
            merged = update_llm_args_with_extra_options(base, str(path))
        want = yaml.safe_load(text)["speculative_config"]["decoding_type"]
        # Releases differ in where the dict becomes a config (from_dict here, or TorchLlmArgs' own validation).
        spec = getattr(TorchLlmArgs(**{k: v for k, v in merged.items() if k != "backend"}), "speculative_config", None)
        if spec is None or isinstance(spec, dict):
            raise TypeError(f"speculative_config stayed {type(spec).__name__}: not parsed into a decoding config")
        out[root.name] = "ok: " + type(spec).__name__ + " from decoding_type " + want
    except Exception as exc:
        out[root.name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
print(json.dumps(out))
"""

def _python(code: str, args: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout:.0f} s"
    return out.returncode, out.stdout, out.stderr


def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def installed_line(version: str | None) -> str | None:
    from eagle_trt.engine.trtllm_lines import line_for

    line = line_for(version)
    return line.name if line else None


def find_bundles(work: Path) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for meta in sorted((work / "bundles").glob("*/*/trtllm.json")):
        out.setdefault(json.loads(meta.read_text())["trtllm_version"], []).append(meta.parent)
    return out


def run(args) -> int:
    check = Check(args.budget)
    work = args.bundles_from or args.workdir or Path(tempfile.mkdtemp(prefix="eagle-trt-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        bundles = find_bundles(work) if args.bundles_from else build_bundles(work)
        if not bundles:
            raise FileNotFoundError(f"no bundles under {work / 'bundles'}")
    except Exception as exc:  # noqa: BLE001 - a check script reports, it does not crash
        check.report("bundles", "FAIL", f"{type(exc).__name__}: {exc}")
        return finish(check, args)
    sizes = sum(f.stat().st_size for paths in bundles.values() for b in paths for f in b.rglob("*") if f.is_file())
    check.report("bundles", "PASS", f"{sum(map(len, bundles.values()))} bundles under {work / 'bundles'} "
                                    f"({sizes / 2**20:.1f} MiB, {time.monotonic() - start:.0f} s)")  # fmt: skip

    code, stdout, stderr = _python(_PROBE, [], check.limit(args.step_timeout))
    info = _last_json(stdout) if code == 0 else None
    if info is None:
        check.report("versions", "FAIL", f"probe failed: {stderr.strip()[-300:]}")
        return finish(check, args)
    version = info.get("tensorrt_llm")
    check.report("versions", "PASS", ", ".join(f"{k} {v}" for k, v in info.items() if not k.endswith("_error")))
    if not version or not info.get("gpu"):
        why = ("TensorRT-LLM is not installed" + (f" ({info['tensorrt_llm_error']})" if "tensorrt_llm_error" in info
                                                  else "")) if not version else "no CUDA GPU is visible"  # fmt: skip
        check.report("config", "SKIP", f"{why}: the GPU steps need TensorRT-LLM and an NVIDIA GPU")
        return finish(check, args, missing=True)

    from eagle_trt.engine.trtllm_lines import refusal

    line = args.trtllm_version or installed_line(version)
    if line not in bundles:
        check.report("config", "FAIL", refusal(version) or f"no bundles of line {line} under {work / 'bundles'}")
        return finish(check, args)
    mine = bundles[line]
    code, stdout, stderr = _python(_CONFIG, [str(b) for b in mine], check.limit(args.step_timeout))
    results = _last_json(stdout) if code == 0 else None
    if results is None:
        check.report("config", "FAIL", f"line {line}: {stderr.strip()[-300:]}")
    else:
        bad = {k: v for k, v in results.items() if not v.startswith("ok")}
        check.report("config", "FAIL" if bad else "PASS", f"line {line}: " + (json.dumps(bad) if bad else
                     f"{len(results)} bundles' YAML read the trtllm-serve way by TensorRT-LLM {version}"))  # fmt: skip
    if args.serve:
        serve_step(check, mine[0], args)

    for bundle in mine:
        step = f"generate {bundle.name}"
        limit = check.limit(args.step_timeout)
        report_path = work / f"{bundle.name}.validate.json"
        cmd = [sys.executable, str(bundle / "validate.py"), "--max-tokens", str(args.max_tokens),
               "--prompt", "Write a haiku about the sea.", "--json", str(report_path)]  # fmt: skip
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            check.report(step, "FAIL", f"timed out after {limit:.0f} s")
            continue
        detail = next((ln for ln in out.stdout.splitlines() if ln.startswith("prompt 1:")), "")
        if out.returncode == 0:
            check.report(step, "PASS", detail)
        elif out.returncode == 1 and report_path.is_file():  # both ran; the outputs differ
            check.report(step, "FAIL" if args.strict_lossless else "WARN", f"{detail} (random tiny model: bf16 near-ties)")
        else:
            check.report(step, "FAIL", (out.stderr.strip() or out.stdout.strip())[-400:])
    return finish(check, args)


def _http(url: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def serve_step(check: Check, bundle: Path, args) -> None:
    """The bundle's own serve.sh (trtllm-serve on 127.0.0.1), polled until /health answers, one greedy completion
    under the engine's name, then stopped: its process group gets SIGTERM, then SIGKILL after 20 s."""
    import os
    import signal
    import socket

    step, limit = f"serve {bundle.name}", check.limit(args.step_timeout)
    with socket.socket() as sock:  # a free loopback port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    name = json.loads((bundle / "trtllm.json").read_text())["served_model_name"]
    log = (args.bundles_from or bundle.parents[2]) / f"{bundle.name}.serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", str(bundle / "serve.sh"), "--port", str(port)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "HOST": "127.0.0.1"})  # fmt: skip
    base, deadline, status = f"http://127.0.0.1:{port}", time.monotonic() + limit, (0, "")
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            status = _http(base + "/health", timeout=2.0)
            if status[0] == 200:
                break
            time.sleep(2.0)
        if status[0] != 200:
            tail = log.read_text(errors="replace").strip()[-300:]
            why = f"exited with {proc.returncode}" if proc.poll() is not None else f"no /health in {limit:.0f} s"
            check.report(step, "FAIL", f"trtllm-serve {why}: {tail}")
            return
        code, text = _http(base + "/v1/completions", {"model": name, "prompt": "The capital of France is",
                                                      "max_tokens": 8, "temperature": 0.0}, timeout=60.0)  # fmt: skip
        ok = code == 200 and "choices" in text
        check.report(step, "PASS" if ok else "FAIL", f"/v1/completions as {name}: HTTP {code} {text[:200]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def finish(check: Check, args, missing: bool = False) -> int:
    failed = [r for r in check.results if r["status"] == "FAIL"]
    code = 1 if failed else (3 if missing else 0)
    if args.json_out:
        tmp = args.json_out.with_name(f".{args.json_out.name}.tmp")
        tmp.write_text(json.dumps({"exit_code": code, "results": check.results}, indent=2) + "\n")
        tmp.replace(args.json_out)
    passed = sum(r["status"] == "PASS" for r in check.results)
    skipped = sum(r["status"] in ("SKIP", "WARN") for r in check.results)
    print(f"{passed} passed, {len(failed)} failed, {skipped} skipped")
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="where bundles and reports go (default: a new temp dir)")
    ap.add_argument("--bundles-from", type=Path, help="run the bundles an earlier run built in this dir")
    ap.add_argument("--trtllm-version", choices=["1.2", "1.3+"], help="line to run (default: the installed one)")
    ap.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per generation (default 32)")
    ap.add_argument("--step-timeout", type=float, default=240, help="seconds per step (default 240)")
    ap.add_argument("--budget", type=float, default=570, help="seconds for the whole run (default 570)")
    ap.add_argument("--strict-lossless", action="store_true", help="unequal spec / no-spec output fails")
    ap.add_argument("--no-serve", dest="serve", action="store_false",
                    help="skip the step that starts one bundle's serve.sh (trtllm-serve) and asks it for a completion")
    ap.add_argument("--json-out", type=Path, help="write every step's result here")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
