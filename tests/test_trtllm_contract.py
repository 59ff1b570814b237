"""The TensorRT-LLM bundle against each line's contract, no GPU and no tensorrt_llm needed.

Every field of extra_llm_api_options.yaml must exist in the TensorRT-LLM line the bundle is for
(tests/fixtures/trtllm_contract_<line>.json, read from TensorRT-LLM's source and API reference) and
carry the recorded value type (tests/fixtures/trtllm_schema.json). Then the runtime paths: tensorrt_llm
absent (exit 3 with the install hint), and present (a fake that accepts exactly one line's fields
stands in for it, so build validates through LLM(...) and run generates through it).
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.engine import build_engine, read_manifest
from eagle_trt.engine import trtllm_backend, trtllm_bundle
from eagle_trt.runtime import trtllm_runner
from eagle_trt.engine.trtllm_lines import LINES
from eagle_trt.errors import ConfigError, InputError, MissingDependencyError
from trtllm_fakes import (AUX, CONTRACTS, SCHEMA, VERSIONS, FakeLLM, check_types, contract_violations, fake_modules,
                          tiny_trtllm_checkpoint, trt_cfg)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory) -> Path:
    return tiny_trtllm_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("trt") / "ckpt")


def options(root: Path) -> dict:
    return yaml.safe_load((root / "extra_llm_api_options.yaml").read_text())


# ---- per-line contract ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "line,changes",
    [("1.3+", {}), ("1.3+", {"tree": "chain"}), ("1.3+", {"kv_cache_dtype": "fp8"}),
     ("1.3+", {"dtype": "float16", "max_batch_size": 8}),
     ("1.2", {}), ("1.2", {"tree": "chain", "kv_cache_dtype": "fp8"}),
     ("1.2", {"tree": "static", "static_tree": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]})],
)  # fmt: skip
def test_bundle_writes_only_fields_its_line_defines(ckpt, tmp_path, line, changes):
    cfg = trt_cfg(trtllm_version=line, **changes)
    summary = build_engine(cfg, ckpt, tmp_path / "e")
    root, doc = summary.engine_dir, options(summary.engine_dir)
    assert contract_violations(doc, line) == []
    check_types(doc, SCHEMA["llm_api"], "TorchLlmArgs")
    spec, kv = doc["speculative_config"], doc["kv_cache_config"]
    assert kv == {"dtype": "fp8" if cfg.kv_cache_dtype == "fp8" else "auto"}
    assert (doc["max_batch_size"], doc["max_input_len"], doc["max_seq_len"]) == (cfg.max_batch_size, 512, 768)
    assert doc["max_beam_width"] == 1 and doc["max_num_tokens"] >= doc["max_input_len"]
    assert spec["decoding_type"] == "Eagle3" and spec["speculative_model"] == "./draft"
    assert spec["eagle3_layers_to_capture"] == AUX and spec["max_draft_len"] == 4
    assert "posterior_threshold" not in spec and "greedy_sampling" not in spec  # greedy acceptance: the default
    tree = line == "1.3+" and cfg.tree == "dynamic"
    assert ("use_dynamic_tree" in spec) is tree
    if tree:
        assert (spec["dynamic_tree_max_topK"], spec["max_total_draft_tokens"]) == (4, 16)
    else:  # a chain of max_draft_len: no tree fields at all
        assert not {"use_dynamic_tree", "dynamic_tree_max_topK", "max_total_draft_tokens", "eagle_choices"} & set(spec)
    chain_warning = [w for w in summary.warnings if "runs EAGLE-3 as a chain of max_draft_len" in w]
    assert bool(chain_warning) is (line == "1.2" and cfg.tree != "chain")
    meta = json.loads((root / "trtllm.json").read_text())
    assert (meta["trtllm_version"], meta["tree"], meta["served_model_name"]) == (line, "dynamic" if tree else "chain",
                                                                                 "tiny")  # fmt: skip
    m = read_manifest(root)
    assert m.backend == "trtllm" and {"extra_llm_api_options.yaml", "trtllm.json", "serve.sh", "bench.sh",
                                      "validate.py"} <= set(m.files)  # fmt: skip


def test_contract_check_fails_on_a_field_the_line_lacks(ckpt, tmp_path):
    # What 1.2 bundles used to write: fields 1.3+ removed, so its strict config refuses them.
    doc = options(build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir)
    doc["speculative_config"].update(eagle3_one_model=True, greedy_sampling=True)
    assert sorted(contract_violations(doc, "1.3+")) == ["speculative_config.eagle3_one_model",
                                                        "speculative_config.greedy_sampling"]
    doc["speculative_config"]["eagle_choices"] = [[0]]  # still in 1.3.0rc27, gone in 1.4.0rc1
    assert "speculative_config.eagle_choices" in contract_violations(doc, "1.3+")
    assert contract_violations(doc, "1.2") == []


def test_line_rules_are_within_the_recorded_contracts():
    from trtllm_fakes import line_fields

    for name, line in LINES.items():
        allowed = line_fields(name, "Eagle3DecodingConfig")
        assert line.speculative_fields | line.runtime_fields <= allowed, (name, (line.speculative_fields | line.runtime_fields) - allowed)
        assert line.runs_trees is CONTRACTS[name]["behaviour"]["runs_trees"]
        assert line.transformers_pin == CONTRACTS[name]["transformers_pin"]
    assert {"greedy_sampling", "posterior_threshold", "eagle3_one_model", "eagle_choices"}.isdisjoint(
        line_fields("1.3+", "Eagle3DecodingConfig"))


def test_contract_fixtures_name_their_sources():
    for line, contract in CONTRACTS.items():
        assert contract["line"] == line and contract["sources"]
        for source in contract["sources"]:
            assert source.get("url", "").startswith("https://") or (
                source["repo"] == "NVIDIA/TensorRT-LLM" and source["path"] and "commit" in source), source
            assert source.get("commit") is None or len(source["commit"]) == 40
        assert contract["extracted"]["classes"]["Eagle3DecodingConfig"]["extra"] == "forbid"
    for release, info in CONTRACTS["1.3+"]["releases_checked"].items():
        assert f"/{release}/llm-api/reference/Eagle3DecodingConfig.html" in info["url"]


def test_draft_weights_take_the_names_the_loader_reads(ckpt, tmp_path):
    for line in LINES:
        root = build_engine(trt_cfg(trtllm_version=line), ckpt, tmp_path / line.replace("+", "")).engine_dir
        draft = CONTRACTS[line]["extracted"]["draft_checkpoint"]
        with safe_open(str(root / "draft" / "model.safetensors"), "pt") as fh:
            keys = list(fh.keys())
        assert any(k.startswith("midlayer.") for k in keys) and not any(k.startswith("layers.") for k in keys)
        for key in keys:
            top, _, rest = key.partition(".")
            assert top in set(draft["draft_model_modules"]) | {"lm_head"}, key
            if top == "midlayer":
                assert rest.split(".")[0] in draft["decoder_layer_modules"], key
    # The torch engine keeps the checkpoint's own names (its runtime tells the two layouts apart by them).
    torch_root = build_engine(trt_cfg(backend="torch", dtype="float32"), ckpt, tmp_path / "torch").engine_dir
    with safe_open(str(torch_root / "draft" / "model.safetensors"), "pt") as fh:
        assert any(k.startswith("layers.0.") for k in fh.keys())


def test_static_tree_is_refused_where_the_line_has_none(ckpt, tmp_path):
    cfg = trt_cfg(tree="static", static_tree=[[0], [1]])
    with pytest.raises(ConfigError, match=r'^tree static: TensorRT-LLM 1.3 \(1.3.0rc10 and later\), 1.4 and main do not all '
                                          r'have static trees .* or build for trtllm_version "1.2", which runs a chain$'):
        build_engine(cfg, ckpt, tmp_path / "e", dry_run=True)


def test_scripts_are_executable_shell_with_documented_options(ckpt, tmp_path):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    cli = SCHEMA["cli"]
    serve_options = set(CONTRACTS["1.3+"]["extracted"]["trtllm_serve_options"])
    for name, tool, allowed in [
        ("serve.sh", "trtllm-serve", set(cli["trtllm-serve"]["options"]) & serve_options),
        ("bench.sh", "trtllm-bench", cli["trtllm-bench"]["options"] + cli["trtllm-bench"]["subcommand_options"]),
    ]:
        path = root / name
        assert path.stat().st_mode & 0o111 == 0o111, f"{name} is not executable"
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
        subprocess.run(["bash", "-n", str(path)], check=True)
        start = next(i for i, line in enumerate(text.splitlines()) if line.startswith(f"launch {tool} "))
        line = " ".join(" ".join(text.splitlines()[start:start + 3]).split("\\"))
        flags = [w for w in line.split() if w.startswith("--")]
        assert flags and set(flags) <= set(allowed), f"{name}: {sorted(set(flags) - set(allowed))}"
        assert '--extra_llm_api_options "$run/extra_llm_api_options.yaml"' in line and "--backend pytorch" in line
        # Paths are absolute: the caller's working directory stays as it was (cd only inside $(...)).
        assert not [ln for ln in text.splitlines() if ln.lstrip().startswith("cd ")]
    assert CONTRACTS["1.2"]["extracted"]["trtllm_serve_options"] == sorted(cli["trtllm-serve"]["options"] + ["--config"])


def test_fp8_kv_scales_are_kept_the_modelopt_way(ckpt, tmp_path):
    work = Path(shutil.copytree(ckpt, tmp_path / "ckpt"))
    scales = {"target.k_scales": torch.linspace(0.01, 0.08, 8), "target.v_scales": torch.linspace(0.1, 0.8, 8),
              "draft.k_scales": torch.tensor([0.5]), "draft.v_scales": torch.tensor([0.25])}  # fmt: skip
    save_file(scales, str(work / "kv_scales.safetensors"))
    root = build_engine(trt_cfg(kv_cache_dtype="fp8"), work, tmp_path / "e").engine_dir
    quant = json.loads((root / "target" / "hf_quant_config.json").read_text())
    check_types(quant, SCHEMA["hf_quant_config"], "HfQuantConfig", "hf_quant_config.json")
    assert quant["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": "FP8"}
    k_name, v_name = SCHEMA["hf_quant_config"]["kv_scale_tensor_names"]
    with safe_open(str(root / "target" / "model.safetensors"), "pt") as fh:
        for i in range(8):
            k, v = fh.get_tensor(k_name.format(i=i)), fh.get_tensor(v_name.format(i=i))
            assert k.dtype == v.dtype == torch.float32 and k.shape == ()
            assert (k.item(), v.item()) == (scales["target.k_scales"][i].item(), scales["target.v_scales"][i].item())
    assert "kv_scales.safetensors" in read_manifest(root).files
    assert options(root)["kv_cache_config"] == {"dtype": "fp8"}
    plain = build_engine(trt_cfg(), work, tmp_path / "p").engine_dir
    assert not (plain / "target" / "hf_quant_config.json").exists()


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
    # trtllm_validate.py is the bundle's validate.py: it runs where only TensorRT-LLM is installed.
    assert sorted(importers) == ["eagle_trt/engine/trtllm_backend.py", "eagle_trt/engine/trtllm_validate.py"]
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
                                      str(tmp_path / "e"), "--backend", "trtllm", "--trtllm-version", "1.2",
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["backend"] == "trtllm" and data["trtllm"]["validated"] is False
    assert (data["trtllm"]["trtllm_version"], data["trtllm"]["tree"]) == ("1.2", "chain")
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Warning: TensorRT-LLM 1.2 (1.2.0rc7 to 1.2.x, the stable line; and 1.3.0 rcs before rc10) runs EAGLE-3 "
                               "as a chain of "
                               "max_draft_len = draft_length (4) tokens per step")
    assert lines[-1].startswith("Not validated on TensorRT-LLM: TensorRT-LLM is not installed")
    assert (tmp_path / "e" / "serve.sh").is_file()


def test_build_rejects_an_unknown_line_in_one_line(tmp_path):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("backend: trtllm\ndtype: bfloat16\ntrtllm_version: 1.2\n")
    result = CliRunner().invoke(app, ["build", "-c", str(cfg_path), "--dry-run"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f'Error: {cfg_path}: trtllm_version: quote the line, e.g. trtllm_version: "1.2" '
                                     '(or "1.3+") (got 1.2)')  # fmt: skip
    result = CliRunner().invoke(app, ["build", "-c", str(cfg_path).replace("cfg", "none"), "--trtllm-version", "1.4"])
    assert result.exit_code == 2


def test_run_trtllm_engine_without_tensorrt_llm_exits_3(ckpt, tmp_path, no_trtllm):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi"])
    assert result.exit_code == 3, result.output
    assert "Error: TensorRT-LLM is not installed" in result.stderr
    assert "  hint: pip install 'eagle-trt" in result.stderr and "with Python 3.10 or 3.12 and CUDA" in result.stderr


def test_run_verifies_hashes_before_the_backend(ckpt, tmp_path, no_trtllm):
    root = build_engine(trt_cfg(), ckpt, tmp_path / "e").engine_dir
    path = root / "extra_llm_api_options.yaml"
    path.write_text(path.read_text().replace("max_draft_len: 4", "max_draft_len: 9"))  # same size, new meaning
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi"])
    assert result.exit_code == 2 and "does not match its sha256" in " ".join(result.stderr.split())


# ---- tensorrt_llm present (a fake that accepts one line's fields) ---------------------------------

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


def test_build_validates_through_llm(ckpt, tmp_path, fake_trtllm):
    summary = build_engine(trt_cfg(kv_cache_dtype="fp8", trtllm_version=fake_trtllm), ckpt, tmp_path / "e")
    assert summary.trtllm["validated"] is True and summary.trtllm["reason"] is None
    (llm,) = FakeLLM.made
    assert llm.closed and llm.calls and Path(llm.model).name == "target"
    assert llm.kwargs["kv_cache_config"].dtype == "fp8" and llm.kwargs["max_seq_len"] == 768
    spec = llm.kwargs["speculative_config"]
    assert Path(spec.speculative_model).is_absolute()
    assert getattr(spec, "max_total_draft_tokens", None) == (16 if fake_trtllm == "1.3+" else None)


def test_build_for_another_line_is_written_but_not_validated(ckpt, tmp_path, fake_trtllm):
    other = "1.2" if fake_trtllm == "1.3+" else "1.3+"
    summary = build_engine(trt_cfg(trtllm_version=other), ckpt, tmp_path / "e")
    assert summary.trtllm["validated"] is False and not FakeLLM.made
    assert summary.trtllm["reason"] == (f"the bundle is for TensorRT-LLM {other} but {VERSIONS[fake_trtllm]} (line "
                                        f"{fake_trtllm}) is installed: rebuild it with --trtllm-version {fake_trtllm}")


def test_iterations_come_from_the_request_output_and_zero_reads_not_reported(ckpt, tmp_path, fake_trtllm,
                                                                             monkeypatch):
    """TensorRT-LLM keeps decoding_iter on the request's output, not on its CompletionOutput; a run whose
    iterations come back 0 (unreported) shows tau as not reported instead of inventing one."""
    from eagle_trt.runtime.trtllm_runner import reported_count

    assert [reported_count(v) for v in (None, 0, "x", 3)] == [None, None, None, 3]
    root = build_engine(trt_cfg(trtllm_version=fake_trtllm), ckpt, tmp_path / "e").engine_dir
    real = FakeLLM.generate

    def unreported(self, inputs, sampling_params):
        outs = real(self, inputs, sampling_params)
        for o in outs:
            o.outputs[0].decoding_iter = 7  # on the CompletionOutput: must not be read
            o.decoding_iter = 0
        return outs

    monkeypatch.setattr(FakeLLM, "generate", unreported)
    args = ["run", "--engine", str(root), "--prompt", "hi", "--no-chat", "--tree", "chain", "--max-new-tokens", "3"]
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert data["metrics"]["acceptance_length"] is None and data["metrics"]["verify_steps"] is None
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == 0 and "not reported" in shown.output, shown.output


def test_run_generates_through_llm_api(ckpt, tmp_path, fake_trtllm):
    root = build_engine(trt_cfg(trtllm_version=fake_trtllm), ckpt, tmp_path / "e").engine_dir
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi", "--no-chat", "--json",
                                      "--tree", "chain", "--max-new-tokens", "3"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["token_ids"] == [72, 105, 33] and isinstance(data["text"], str)
    m = data["metrics"]
    assert (m["backend"], m["generated_tokens"], m["acceptance_length"], m["acceptance_rate"]) == ("trtllm", 3, 1.5, 0.25)
    assert (m["total_draft_tokens"], m["total_accepted_draft_tokens"], m["prefill_ms"]) == (8, 2, 5.0)
    assert m["trtllm_tree"] == "chain"
    validated, llm = FakeLLM.made  # one LLM validated the build, one generated
    assert validated.closed
    spec = llm.kwargs["speculative_config"]
    assert spec.max_draft_len == 4 and not hasattr(spec, "use_dynamic_tree")  # --tree chain reached the config
    (inputs, params), = llm.calls
    assert inputs[0]["prompt_token_ids"] and params.max_tokens == 3 and params.top_k == 1


def test_run_ar_mode_has_no_speculation(ckpt, tmp_path, fake_trtllm):
    root = build_engine(trt_cfg(trtllm_version=fake_trtllm), ckpt, tmp_path / "e").engine_dir
    result = CliRunner().invoke(app, ["run", "--engine", str(root), "--prompt", "hi", "--mode", "ar", "--json"])
    assert result.exit_code == 0, result.output
    assert "speculative_config" not in FakeLLM.made[-1].kwargs


def run_opts(**changes):
    import types

    base = dict(mode="eagle", tree="dynamic", draft_length=3, beam_width=2, total_tokens=6, static_tree=None,
                temperature=0.0, posterior_threshold=None)  # fmt: skip
    return types.SimpleNamespace(**{**base, **changes})


def test_run_time_settings_stay_in_the_line(tmp_path):
    from trtllm_fakes import line_fields

    for line in LINES:
        root = tmp_path / line.replace("+", "")
        root.mkdir()
        cfg = trt_cfg(trtllm_version=line)
        (root / "trtllm.json").write_text(json.dumps(trtllm_bundle.bundle_meta(cfg, trtllm_bundle.llm_api_options(cfg, AUX))))
        runner = trtllm_runner.TrtllmRunner(root, trtllm_bundle.llm_api_options(cfg, AUX))
        spec = runner._options_for(run_opts(temperature=0.7))[0]["speculative_config"]
        assert set(spec) <= line_fields(line, "Eagle3DecodingConfig")
        assert ("use_dynamic_tree" in spec) is (line == "1.3+")  # 1.2 drafts a chain whatever --tree says
        if line == "1.2":  # typical acceptance: lossy, opt-in, a 1.2 field
            lossy = runner._options_for(run_opts(posterior_threshold=0.09))[0]["speculative_config"]
            assert (lossy["greedy_sampling"], lossy["posterior_threshold"]) == (False, 0.09)
        else:
            with pytest.raises(InputError, match="has no typical acceptance"):
                runner._options_for(run_opts(posterior_threshold=0.09))
        with pytest.raises(InputError, match="runs no static trees"):
            runner._options_for(run_opts(tree="static", static_tree=[[0]]))
