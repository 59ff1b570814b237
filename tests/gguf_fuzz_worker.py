"""The child side of tests/test_fuzz_gguf_data.py: one damaged GGUF through `convert --head`, `build` (weights: auto,
the file's own blocks) and a 4-token `run`, then the engine's target logits on the prompt, in a process of its own.

The parent forks each case from a server that imported this module (multiprocessing's forkserver, `preload`), so the
slow imports (torch, transformers' llama, the CLI) and the compiled kernels are loaded once, and a crash in the C++
kernels ends this child only. The result goes to CASE_DIR/result.json:

    {"steps": [{"step": "convert", "exit": 2, "stderr": "Error: ...", "unexpected": null}, ...],
     "tokens": [..] or None, "stop_reason": "length" or ..., "finite": true / false / None}
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

os.environ.pop("EAGLE_TRT_DEBUG", None)  # a traceback would be the failure the harness looks for, not hide

import torch  # noqa: E402

torch.set_num_threads(1)

import transformers.models.llama.modeling_llama  # noqa: E402,F401  (imported once, in the server)
from typer.testing import CliRunner  # noqa: E402

from eagle_trt.cli.app import app  # noqa: E402
from eagle_trt.models import native  # noqa: E402

native.library()  # compiled (or found in the cache) and loaded once, before the server forks
PROMPT = "at tat a"
LOADED_IN = os.getpid()  # the server's, in every case forked from it


def check_preloaded() -> None:
    """Exit 0 in a child of a server that imported this module, 3 where the child had to import it itself."""
    raise SystemExit(0 if LOADED_IN != os.getpid() else 3)


def _steps(d: Path, gguf: Path, head: Path) -> list[tuple[str, list[str]]]:
    cfg = d / "cfg.yaml"
    cfg.write_text(f"name: fuzz\ncheckpoint_dir: {d / 'ckpt'}\nmax_input_len: 32\nmax_output_len: 16\n"
                   "weights: auto\n")
    return [
        ("convert", ["convert", str(gguf), "--output", str(d / "ckpt"), "--head", str(head), "--no-calibrate-kv"]),
        ("build", ["build", "--config", str(cfg), "--output", str(d / "engine")]),
        ("run", ["run", "--engine", str(d / "engine"), "--prompt", PROMPT, "--no-chat", "--max-new-tokens", "4",
                 "--json"]),
    ]


def _target_logits_finite(engine: Path, prompt_ids: list[int]) -> bool:
    """The engine's target, on the kernels `run` chose, gives finite logits for every prompt position."""
    from eagle_trt.engine.manifest import read_manifest
    from eagle_trt.models.llama import LlamaTarget

    manifest = read_manifest(engine)
    target = LlamaTarget.load(engine / "target", getattr(torch, manifest.dtype),
                              block_compute=manifest.block_compute)
    ids = torch.tensor(prompt_ids)
    logits, _ = target.forward(ids, torch.arange(ids.numel()), target.new_cache(ids.numel() + 4))
    return bool(torch.isfinite(logits.float()).all())


def run_case(case_dir: str, head: str) -> None:
    d = Path(case_dir)
    result: dict = {"steps": [], "tokens": None, "finite": None}
    runner = CliRunner()
    for step, args in _steps(d, d / "m.gguf", Path(head)):
        r = runner.invoke(app, args)
        unexpected = None
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            unexpected = "".join(traceback.format_exception(r.exception))[-3000:]
        result["steps"].append({"step": step, "exit": r.exit_code, "stderr": r.stderr[-3000:],
                                "unexpected": unexpected})
        if r.exit_code != 0:
            break
        if step == "run":
            out = json.loads(r.stdout)
            result["tokens"], result["stop_reason"] = out["token_ids"], out["metrics"]["stop_reason"]
            result["finite"] = _target_logits_finite(d / "engine", out["prompt_token_ids"])
    (d / "result.json").write_text(json.dumps(result))
