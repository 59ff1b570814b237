"""Contract tests of the TensorRT-LLM bundle, no GPU and no tensorrt_llm needed.

The generated extra_llm_api_options.yaml, legacy EAGLE checkpoint config and hf_quant_config.json
are checked field by field against tests/fixtures/trtllm_schema.json (TensorRT-LLM's documented
field names and types, with the version they come from). Then the two runtime paths: tensorrt_llm
absent (exit 3 with the install hint), and present (a fake module that enforces the same schema
stands in for it, so build validates through LLM(...) and run generates through it).
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import types
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from conftest import write_random_head
from eagle_trt.cli.app import app
from eagle_trt.config import EagleConfig
from eagle_trt.engine import build_engine, read_manifest
from eagle_trt.engine import trtllm_backend, trtllm_bundle
from eagle_trt.errors import MissingDependencyError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "tests" / "fixtures" / "trtllm_schema.json").read_text())
AUX = [1, 3, 4]


# ---- schema checking ----------------------------------------------------------------------------

def _type_ok(value, spec: str) -> bool:
    for t in spec.split("|"):
        if (t == "null" and value is None) or (t == "bool" and isinstance(value, bool)):
            return True
        if t == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if (t == "str" and isinstance(value, str)) or (t == "object" and isinstance(value, dict)):
            return True
        if t == "list[int]" and isinstance(value, list) and all(type(v) is int for v in value):
            return True
        if t == "list[list[int]]" and isinstance(value, list) and all(
            isinstance(p, list) and all(type(v) is int for v in p) for p in value
        ):
            return True
    return False


def check(doc: dict, section: dict, name: str, where: str = "") -> None:
    """Every key is a documented field of the right type; every required key is present."""
    schema = section[name]
    where = where or name
    missing = [k for k in schema["required"] if k not in doc]
    assert not missing, f"{where}: missing {missing}"
    for key, value in doc.items():
        key = schema.get("aliases", {}).get(key, key)
        assert key in schema["fields"], f"{where}.{key} is not a {name} field of TensorRT-LLM {SCHEMA['tensorrt_llm_version']}"
        spec = schema["fields"][key]
        assert _type_ok(value, spec["type"]), f"{where}.{key} = {value!r} is not {spec['type']}"
        if "enum" in spec:
            assert value in spec["enum"], f"{where}.{key} = {value!r} not in {spec['enum']}"
        if "min" in spec:
            assert value >= spec["min"], f"{where}.{key} = {value} < {spec['min']}"
        if "max" in spec:
            assert value <= spec["max"], f"{where}.{key} = {value} > {spec['max']}"
        if "schema" in spec:
            check(value, section, spec["schema"], f"{where}.{key}")


def test_fixture_records_version_and_sources():
    assert SCHEMA["tensorrt_llm_version"] == trtllm_bundle.TRTLLM_VERSION
    assert all(s.startswith("https://") for s in SCHEMA["sources"]) and len(SCHEMA["sources"]) >= 5


# ---- builds ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trt") / "ckpt"
    shutil.copytree(tiny_model_dir, root / "target")
    write_random_head(root / "draft", aux=tuple(AUX))
    return root


def trt_cfg(**changes) -> EagleConfig:
    base = dict(name="tiny", backend="trtllm", dtype="bfloat16", max_input_len=512, max_output_len=256,
                draft_length=4, total_tokens=16, max_beam_width=4, lookup_tokens=0)  # fmt: skip
    return EagleConfig(**{**base, **changes})


def options(root: Path) -> dict:
    return yaml.safe_load((root / "extra_llm_api_options.yaml").read_text())


@pytest.mark.parametrize(
    "changes",
    [{}, {"kv_cache_dtype": "fp8"}, {"tree": "chain"}, {"dtype": "float16", "max_batch_size": 8},
     {"tree": "static", "static_tree": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]}],
)  # fmt: skip
def test_llm_api_yaml_matches_schema(ckpt, tmp_path, changes):
    cfg = trt_cfg(**changes)
    root = build_engine(cfg, ckpt, tmp_path / "e").engine_dir
    doc = options(root)
    check(doc, SCHEMA["llm_api"], "TorchLlmArgs")
    spec, kv = doc["speculative_config"], doc["kv_cache_config"]
    assert kv == {"dtype": "fp8" if cfg.kv_cache_dtype == "fp8" else "auto"}
    assert (doc["max_batch_size"], doc["max_input_len"], doc["max_seq_len"]) == (cfg.max_batch_size, 512, 768)
    assert doc["max_beam_width"] == 1 and doc["max_num_tokens"] >= doc["max_input_len"]
    assert spec["decoding_type"] == "Eagle3" and spec["speculative_model"] == "./draft"
    assert spec["greedy_sampling"] is True and "posterior_threshold" not in spec  # lossless: greedy acceptance only
    assert spec["eagle3_layers_to_capture"] == AUX
    if cfg.tree == "dynamic":
        assert (spec["max_draft_len"], spec["dynamic_tree_max_topK"], spec["max_total_draft_tokens"]) == (4, 4, 16)
        assert spec["use_dynamic_tree"] is True
    elif cfg.tree == "chain":
        assert spec["max_draft_len"] == 4 and "use_dynamic_tree" not in spec and "max_total_draft_tokens" not in spec
    else:
        assert spec["eagle_choices"] == cfg.static_tree and (spec["max_draft_len"], spec["max_total_draft_tokens"]) == (3, 5)
    assert (root / "target" / "tokenizer.json").is_file()  # target/ is a complete HF dir for TensorRT-LLM
    assert json.loads((root / "target" / "config.json").read_text())["torch_dtype"] == cfg.dtype
    m = read_manifest(root)
    assert m.backend == "trtllm" and {"extra_llm_api_options.yaml", "serve.sh", "bench.sh"} <= set(m.files)


def test_scripts_are_executable_shell_with_documented_options(ckpt, tmp_path):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    cli = SCHEMA["cli"]
    for name, tool, allowed in [
        ("serve.sh", "trtllm-serve", cli["trtllm-serve"]["options"]),
        ("bench.sh", "trtllm-bench", cli["trtllm-bench"]["options"] + cli["trtllm-bench"]["subcommand_options"]),
    ]:
        path = root / name
        assert path.stat().st_mode & 0o111 == 0o111, f"{name} is not executable"
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
        subprocess.run(["bash", "-n", str(path)], check=True)
        line = " ".join(text[text.index(f"exec {tool}"):].split("\\\n"))
        flags = [w for w in line.split() if w.startswith("--")]
        assert flags and set(flags) <= set(allowed), f"{name}: {sorted(set(flags) - set(allowed))}"
        assert "--extra_llm_api_options extra_llm_api_options.yaml" in line and "--backend pytorch" in line


def test_fp8_kv_scales_reach_target_the_modelopt_way(ckpt, tmp_path):
    work = Path(shutil.copytree(ckpt, tmp_path / "ckpt"))
    scales = {"target.k_scales": torch.linspace(0.01, 0.08, 8), "target.v_scales": torch.linspace(0.1, 0.8, 8),
              "draft.k_scales": torch.tensor([0.5]), "draft.v_scales": torch.tensor([0.25])}  # fmt: skip
    save_file(scales, str(work / "kv_scales.safetensors"))
    root = build_engine(trt_cfg(kv_cache_dtype="fp8"), work, tmp_path / "e").engine_dir
    quant = json.loads((root / "target" / "hf_quant_config.json").read_text())
    check(quant, SCHEMA["hf_quant_config"], "HfQuantConfig", "hf_quant_config.json")
    assert quant["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": "FP8"}
    k_name, v_name = SCHEMA["hf_quant_config"]["kv_scale_tensor_names"]
    with safe_open(str(root / "target" / "model.safetensors"), "pt") as fh:
        for i in range(8):
            k, v = fh.get_tensor(k_name.format(i=i)), fh.get_tensor(v_name.format(i=i))
            assert k.dtype == v.dtype == torch.float32 and k.shape == ()
            assert (k.item(), v.item()) == (scales["target.k_scales"][i].item(), scales["target.v_scales"][i].item())
    assert "kv_scales.safetensors" in read_manifest(root).files
    # Without fp8 the scales are only carried along, the target untouched.
    plain = build_engine(trt_cfg(), work, tmp_path / "p").engine_dir
    assert not (plain / "target" / "hf_quant_config.json").exists()


def eagle1_ckpt(ckpt: Path, dest: Path) -> Path:
    work = Path(shutil.copytree(ckpt, dest))
    g = torch.Generator().manual_seed(3)
    h, heads, kv, hd, inter = 64, 4, 2, 16, 128
    shapes = {"fc.weight": [h, 2 * h], "layers.0.self_attn.q_proj.weight": [heads * hd, h],
              "layers.0.self_attn.k_proj.weight": [kv * hd, h], "layers.0.self_attn.v_proj.weight": [kv * hd, h],
              "layers.0.self_attn.o_proj.weight": [h, heads * hd], "layers.0.mlp.gate_proj.weight": [inter, h],
              "layers.0.mlp.up_proj.weight": [inter, h], "layers.0.mlp.down_proj.weight": [h, inter],
              "layers.0.post_attention_layernorm.weight": [h]}  # fmt: skip
    save_file({k: torch.randn(s, generator=g) for k, s in shapes.items()}, str(work / "draft" / "model.safetensors"))
    dcfg = json.loads((work / "draft" / "config.json").read_text())
    for key in ("eagle_aux_hidden_state_layer_ids", "draft_vocab_size"):
        dcfg.pop(key, None)
    (work / "draft" / "config.json").write_text(json.dumps(dcfg))
    return work


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_legacy_eagle_checkpoint_matches_schema(ckpt, tmp_path, kv):
    cfg = trt_cfg(kv_cache_dtype=kv, total_tokens=12)
    summary = build_engine(cfg, eagle1_ckpt(ckpt, tmp_path / "ckpt"), tmp_path / "e")
    root = summary.engine_dir
    assert summary.head == "eagle1" and summary.trtllm["validated"] is False
    conf = json.loads((root / "legacy_trt" / "config.json").read_text())
    check(conf, SCHEMA["legacy_checkpoint"], "EagleForCausalLM", "legacy_trt/config.json")
    # Legacy names: max_draft_len is the whole tree, num_eagle_layers its depth.
    assert (conf["max_draft_len"], conf["num_eagle_layers"], conf["max_non_leaves_per_layer"]) == (12, 4, 4)
    assert (conf["num_hidden_layers"], conf["hidden_size"], conf["vocab_size"]) == (8, 64, 260)
    assert conf["eagle_net_config"]["num_hidden_layers"] == 1
    want = "FP8" if kv == "fp8" else None
    assert conf["quantization"]["kv_cache_quant_algo"] == conf["eagle_net_config"]["quantization"]["kv_cache_quant_algo"] == want
    assert not (root / "extra_llm_api_options.yaml").exists()  # the PyTorch backend runs EAGLE-3 only

    script = root / "legacy_trt" / "trtllm_build.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert script.stat().st_mode & 0o111 == 0o111
    build_line = next(line for line in script.read_text().splitlines() if line.startswith("trtllm-build "))
    assert build_line == " ".join(trtllm_bundle.trtllm_build_command(cfg))
    words = build_line.split()
    flags = [w for w in words if w.startswith("--")]
    assert set(flags) <= set(SCHEMA["cli"]["trtllm-build"]["options"])
    assert words[words.index("--speculative_decoding_mode") + 1] == "eagle"
    assert words[words.index("--gemm_plugin") + 1] == "bfloat16"


def test_only_one_module_imports_tensorrt_llm_and_lazily():
    importers = {}
    for path in sorted((REPO / "eagle_trt").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "tensorrt_llm" for n in names):
                importers.setdefault(path.relative_to(REPO).as_posix(), []).append(node)
                assert node not in tree.body, f"{path}: module-level tensorrt_llm import"
    assert list(importers) == ["eagle_trt/engine/trtllm_backend.py"]
    # A fresh interpreter imports the whole package and its CLI without touching tensorrt_llm.
    code = ("import sys, eagle_trt.cli.app, eagle_trt.engine.trtllm_backend, eagle_trt.runtime.session; "
            "print('tensorrt_llm' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


# ---- tensorrt_llm absent --------------------------------------------------------------------------

@pytest.fixture
def no_trtllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # `import tensorrt_llm` -> ModuleNotFoundError


def test_require_tensorrt_llm_absent(no_trtllm):
    with pytest.raises(MissingDependencyError) as info:
        trtllm_backend.require_tensorrt_llm()
    assert str(info.value).startswith("TensorRT-LLM is not installed (")
    assert info.value.exit_code == 3
    assert info.value.hint.startswith("pip install 'eagle-trt[trtllm]' on Linux x86-64/aarch64 with Python 3.10 or 3.12 and CUDA")
    assert trtllm_backend.validation_blocker().startswith("TensorRT-LLM is not installed")


def test_build_without_tensorrt_llm_writes_bundle_and_says_so(ckpt, tmp_path, no_trtllm):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(trt_cfg(backend="torch").model_dump(mode="json")))
    result = CliRunner().invoke(app, ["build", "-c", str(cfg_path), "--checkpoint", str(ckpt), "-o",
                                      str(tmp_path / "e"), "--backend", "trtllm", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["backend"] == "trtllm" and data["trtllm"]["validated"] is False
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Not validated on TensorRT-LLM: TensorRT-LLM is not installed")
    assert (tmp_path / "e" / "serve.sh").is_file()


def test_run_trtllm_engine_without_tensorrt_llm_exits_3(ckpt, tmp_path, no_trtllm):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi"])
    assert result.exit_code == 3, result.output
    assert "Error: TensorRT-LLM is not installed" in result.stderr
    assert "  hint: pip install 'eagle-trt" in result.stderr and "with Python 3.10 or 3.12 and CUDA" in result.stderr


def test_install_hint_printed_verbatim(ckpt, tmp_path, no_trtllm):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi"])
    assert "pip install 'eagle-trt[trtllm]' on Linux x86-64/aarch64 with Python 3.10 or 3.12 and CUDA" in result.stderr


def test_run_verifies_hashes_before_the_backend(ckpt, tmp_path, no_trtllm):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    path = root / "extra_llm_api_options.yaml"
    path.write_text(path.read_text().replace("max_draft_len: 4", "max_draft_len: 9"))  # same size, new meaning
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi"])
    assert result.exit_code == 2 and "does not match its sha256" in " ".join(result.stderr.split())


# ---- tensorrt_llm present (a fake that enforces the schema) ---------------------------------------

class _Strict:
    schema = ""

    def __init__(self, **kwargs):
        doc = {k: (sorted(v) if isinstance(v, set) else v) for k, v in kwargs.items()}
        check(doc, SCHEMA["llm_api"], self.schema)
        self.__dict__.update(kwargs)


class FakeEagle3(_Strict):
    schema = "Eagle3DecodingConfig"


class FakeKv(_Strict):
    schema = "KvCacheConfig"


class FakeLLM:
    made: list = []

    def __init__(self, model, tokenizer=None, **kwargs):
        assert Path(model).is_dir() and Path(model).is_absolute() and Path(tokenizer).is_dir()
        spec = kwargs.get("speculative_config")
        assert spec is None or Path(spec.speculative_model).is_dir()
        top = {k: v for k, v in kwargs.items() if k not in ("speculative_config", "kv_cache_config")}
        assert set(top) <= set(SCHEMA["llm_api"]["TorchLlmArgs"]["fields"])
        self.model, self.kwargs, self.closed, self.calls = model, kwargs, False, []
        FakeLLM.made.append(self)

    def generate(self, inputs, sampling_params):
        self.calls.append((inputs, sampling_params))
        perf = types.SimpleNamespace(
            speculative_decoding=types.SimpleNamespace(total_draft_tokens=8, total_accepted_draft_tokens=2, acceptance_rate=0.25),
            timing_metrics=types.SimpleNamespace(arrival_time=timedelta(0), first_token_time=timedelta(milliseconds=5)),
        )
        done = types.SimpleNamespace(token_ids=[72, 105, 33], finish_reason="length", decoding_iter=2, request_perf_metrics=perf)
        return [types.SimpleNamespace(outputs=[done])]

    def shutdown(self):
        self.closed = True


class FakeSampling:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


@pytest.fixture
def fake_trtllm(monkeypatch):
    mod, api = types.ModuleType("tensorrt_llm"), types.ModuleType("tensorrt_llm.llmapi")
    mod.LLM, mod.SamplingParams, mod.llmapi = FakeLLM, FakeSampling, api
    api.Eagle3DecodingConfig, api.KvCacheConfig = FakeEagle3, FakeKv
    monkeypatch.setitem(sys.modules, "tensorrt_llm", mod)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", api)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    FakeLLM.made = []
    return FakeLLM


def test_build_validates_through_llm(ckpt, tmp_path, fake_trtllm):
    summary = build_engine(trt_cfg(kv_cache_dtype="fp8"), ckpt, tmp_path / "e")
    assert summary.trtllm["validated"] is True and summary.trtllm["reason"] is None
    (llm,) = fake_trtllm.made
    assert llm.closed and llm.calls and Path(llm.model).name == "target"
    assert llm.kwargs["kv_cache_config"].dtype == "fp8" and llm.kwargs["max_seq_len"] == 768
    assert llm.kwargs["speculative_config"].max_total_draft_tokens == 16


def test_run_generates_through_llm_api(ckpt, tmp_path, fake_trtllm):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi", "--no-chat", "--json",
                                      "--tree", "chain", "--max-new-tokens", "3"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["token_ids"] == [72, 105, 33] and isinstance(data["text"], str)
    m = data["metrics"]
    assert (m["backend"], m["generated_tokens"], m["acceptance_length"], m["acceptance_rate"]) == ("trtllm", 3, 1.5, 0.25)
    assert (m["total_draft_tokens"], m["total_accepted_draft_tokens"], m["prefill_ms"]) == (8, 2, 5.0)
    validated, llm = fake_trtllm.made  # one LLM validated the build, one generated
    assert validated.closed
    spec = llm.kwargs["speculative_config"]
    assert spec.max_draft_len == 4 and not hasattr(spec, "use_dynamic_tree")  # --tree chain reached the config
    (inputs, params), = llm.calls
    assert inputs[0]["prompt_token_ids"] and params.max_tokens == 3 and params.top_k == 1


def test_run_ar_mode_has_no_speculation(ckpt, tmp_path, fake_trtllm):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi", "--mode", "ar", "--json"])
    assert result.exit_code == 0, result.output
    assert "speculative_config" not in fake_trtllm.made[-1].kwargs


def test_sampling_and_typical_acceptance_map_to_trtllm_fields(tmp_path):
    runner = trtllm_backend.TrtllmRunner(tmp_path, llm_opts := trtllm_bundle.llm_api_options(trt_cfg(), AUX))
    opts = types.SimpleNamespace(mode="eagle", tree="dynamic", draft_length=3, beam_width=2, total_tokens=6,
                                 static_tree=None, temperature=0.7, posterior_threshold=0.09)  # fmt: skip
    options, speculative = runner._options_for(opts)
    check(options, SCHEMA["llm_api"], "TorchLlmArgs")
    spec = options["speculative_config"]
    assert speculative and (spec["max_draft_len"], spec["dynamic_tree_max_topK"], spec["max_total_draft_tokens"]) == (3, 2, 6)
    assert spec["greedy_sampling"] is False and spec["posterior_threshold"] == 0.09 and spec["allow_advanced_sampling"]
    assert llm_opts["speculative_config"]["greedy_sampling"] is True  # the bundle itself stays lossless
