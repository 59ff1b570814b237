"""Test helpers for the trtllm backend: the recorded schemas and contracts, and a fake tensorrt_llm.

The fake enforces the contract of one TensorRT-LLM line: its Eagle3DecodingConfig, DraftTargetDecodingConfig,
KvCacheConfig and LLM refuse any field the line's fixture (tests/fixtures/trtllm_contract_<line>.json) does not list,
as the real strict pydantic classes do.
"""

from __future__ import annotations

import json
import types
from datetime import timedelta
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA = json.loads((FIXTURES / "trtllm_schema.json").read_text())
CONTRACTS = {line: json.loads((FIXTURES / f"trtllm_contract_{line.replace('+', '')}.json").read_text())
             for line in ("1.2", "1.3+")}  # fmt: skip
VERSIONS = {"1.2": "1.2.1", "1.3+": "1.3.0rc27"}  # an installed release of each line, for the fake
AUX = [1, 3, 4]  # the aux layers of the tiny checkpoint's head


def tiny_trtllm_checkpoint(tiny_model_dir: Path, root: Path) -> Path:
    """The tiny target with a random EAGLE-3 head reading AUX, as `eagle-trt convert` lays it out."""
    import shutil

    from conftest import write_random_head

    shutil.copytree(tiny_model_dir, root / "target")
    write_random_head(root / "draft", aux=tuple(AUX))
    return root


def trt_cfg(**changes):
    """An EagleConfig for a trtllm bundle of the tiny checkpoint (bf16, tree limits that fit it)."""
    from eagle_trt.config import EagleConfig

    base = dict(name="tiny", backend="trtllm", dtype="bfloat16", max_input_len=512, max_output_len=256,
                draft_length=4, total_tokens=16, beam_width=4, lookup_tokens=0)  # fmt: skip
    return EagleConfig(**{**base, **changes})


def line_fields(line: str, cls: str) -> set[str]:
    """Field names (and aliases) of `cls` that every release checked for `line` defines."""
    contract = CONTRACTS[line]
    info = contract["extracted"]["classes"][cls]
    names = set(info["fields"]) | set(info.get("aliases", {}))
    for release in contract.get("releases_checked", {}).values():
        if cls in release:
            names &= set(release[cls]) | set(info.get("aliases", {}))
    return names


def contract_violations(doc: dict, line: str) -> list[str]:
    """Keys of an extra_llm_api_options document that the line's classes do not define."""
    bad = [f"{k}" for k in doc if k not in line_fields(line, "TorchLlmArgs")]
    bad += [f"kv_cache_config.{k}" for k in doc.get("kv_cache_config", {}) if k not in line_fields(line, "KvCacheConfig")]
    spec = doc.get("speculative_config", {})
    bad += [f"speculative_config.{k}" for k in spec if k not in line_fields(line, decoding_class(spec))]
    return bad


def decoding_class(spec: dict) -> str:
    """The LLM API class a speculative_config is read into, by its decoding_type."""
    return "DraftTargetDecodingConfig" if spec.get("decoding_type") == "Draft_Target" else "Eagle3DecodingConfig"


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


def check_types(doc: dict, section: dict, name: str, where: str = "") -> None:
    """Every key has the recorded value type; every key eagle-trt always writes is present."""
    schema = section[name]
    where = where or name
    missing = [k for k in schema["required"] if k not in doc]
    assert not missing, f"{where}: missing {missing}"
    for key, value in doc.items():
        key = schema.get("aliases", {}).get(key, key)
        assert key in schema["fields"], f"{where}.{key} has no recorded type"
        spec = schema["fields"][key]
        assert _type_ok(value, spec["type"]), f"{where}.{key} = {value!r} is not {spec['type']}"
        if "enum" in spec:
            assert value in spec["enum"], f"{where}.{key} = {value!r} not in {spec['enum']}"
        if "min" in spec:
            assert value >= spec["min"], f"{where}.{key} = {value} < {spec['min']}"
        if "max" in spec:
            assert value <= spec["max"], f"{where}.{key} = {value} > {spec['max']}"
        if "schema" in spec:
            check_types(value, section, spec["schema"], f"{where}.{key}")


class _Strict:
    cls = ""
    line = "1.3+"

    def __init__(self, **kwargs):
        unknown = set(kwargs) - line_fields(self.line, self.cls)
        if unknown:  # what pydantic's extra="forbid" reports
            raise ValueError(f"{self.cls}: extra inputs are not permitted: {sorted(unknown)}")
        self.__dict__.update(kwargs)


class FakeLLM:
    made: list = []
    line = "1.3+"
    differ = False  # speculative output differs from plain output (a lossless violation)

    def __init__(self, model, tokenizer=None, **kwargs):
        assert Path(model).is_dir() and Path(model).is_absolute() and Path(tokenizer).is_dir()
        spec = kwargs.get("speculative_config")
        assert spec is None or Path(spec.speculative_model).is_dir()
        top = {k for k in kwargs if k not in ("speculative_config", "kv_cache_config")}
        assert top <= line_fields(self.line, "TorchLlmArgs"), top - line_fields(self.line, "TorchLlmArgs")
        self.model, self.kwargs, self.closed, self.calls = model, kwargs, False, []
        FakeLLM.made.append(self)

    def generate(self, inputs, sampling_params):
        self.calls.append((inputs, sampling_params))
        spec = self.kwargs.get("speculative_config") is not None
        perf = types.SimpleNamespace(
            speculative_decoding=types.SimpleNamespace(total_draft_tokens=8, total_accepted_draft_tokens=2,
                                                       acceptance_rate=0.25),
            timing_metrics=types.SimpleNamespace(arrival_time=timedelta(0), first_token_time=timedelta(milliseconds=5)),
        )  # fmt: skip
        ids = [72, 105, 34] if (spec and self.differ) else [72, 105, 33]
        done = types.SimpleNamespace(token_ids=ids, finish_reason="length", request_perf_metrics=perf)
        # As TensorRT-LLM's executor/result.py: decoding_iter is the request's (GenerationResult), not on its
        # CompletionOutput (a slots dataclass without that field).
        return [types.SimpleNamespace(outputs=[done], decoding_iter=2 if spec else 3)
                for _ in (inputs if isinstance(inputs, list) else [inputs])]

    def shutdown(self):
        self.closed = True


class FakeSampling:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


def fake_modules(line: str):
    """(tensorrt_llm, tensorrt_llm.llmapi) modules that accept exactly the fields of `line`."""
    mod, api = types.ModuleType("tensorrt_llm"), types.ModuleType("tensorrt_llm.llmapi")
    for name in ("Eagle3DecodingConfig", "DraftTargetDecodingConfig", "KvCacheConfig"):
        strict = type(name, (_Strict,), {"cls": name, "line": line})
        strict.model_fields = {f: None for f in line_fields(line, name)}  # what trtllm_backend._field_names reads
        setattr(api, name, strict)
    llm = type("LLM", (FakeLLM,), {"line": line})
    mod.LLM, mod.SamplingParams, mod.llmapi, mod.__version__ = llm, FakeSampling, api, VERSIONS[line]
    return mod, api


# ---- fake packages for subprocesses (validate.py, the GPU smoke script) ---------------------------

FAKE_TORCH = ("__version__ = '0.0+fake'\nclass version:\n    cuda = '13.0'\nclass cuda:\n"
              "    is_available = staticmethod(lambda: {gpu})\n    get_device_name = staticmethod(lambda i: 'FakeGPU')\n")
FAKE_TRTLLM = '''__version__ = "{version}"
import json, os
from pathlib import Path
ALLOWED = {fields}
class SamplingParams:
    def __init__(self, **kw): self.__dict__.update(kw)
class _Out:  # a CompletionOutput: no decoding_iter (that is the request output's)
    def __init__(self, ids): self.token_ids, self.request_perf_metrics = ids, None
class LLM:
    def __init__(self, model, tokenizer=None, **kw):
        assert Path(model).is_dir() and Path(tokenizer).is_dir(), (model, tokenizer)
        self.spec = kw.get("speculative_config")
        assert self.spec is None or Path(self.spec.speculative_model).is_absolute()
    def generate(self, prompts, params):
        # Each prompt its own tokens, so a comparison of the wrong pairs shows. FAKE_DIFFER=1: every speculative
        # output differs from the plain one in its last token; FAKE_DIFFER=2: only the second prompt's does.
        differ = os.environ.get("FAKE_DIFFER", "") if self.spec is not None else ""
        out = []
        for i, p in enumerate(prompts):
            base = sum(map(ord, str(p)))
            ids = [5 + (base + 7 * t) % 90 for t in range(params.max_tokens)]
            if differ == "1" or (differ == "2" and i == 1):
                ids[-1] = 4
            out.append(type("R", (), {{"outputs": [_Out(ids)], "decoding_iter": 2 if self.spec else 4}})())
        return out
    def shutdown(self): pass
'''
FAKE_LLMAPI = '''from tensorrt_llm import ALLOWED
class _Strict:
    def __init__(self, **kw):
        bad = set(kw) - ALLOWED.get(type(self).__name__, set(kw))
        if bad: raise ValueError(f"extra inputs are not permitted: {{sorted(bad)}}")
        self.__dict__.update(kw)
class Eagle3DecodingConfig(_Strict): pass
class DraftTargetDecodingConfig(_Strict): pass
class KvCacheConfig(_Strict): pass
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs
'''
# The YAML path of trtllm-serve, as TensorRT-LLM's llmapi/llm_args.py has it: update_llm_args_with_extra_options reads
# the file, DecodingBaseConfig.from_dict dispatches speculative_config on decoding_type (a release before the
# Eagle3 floor knows "Eagle" and "DraftTarget" instead, and raises "Invalid decoding type"), the YAML wins over
# the command line's arguments, and LLM(...) validates everything as TorchLlmArgs (unknown fields refused).
FAKE_LLM_ARGS = '''import yaml
from tensorrt_llm import ALLOWED, DECODING_TYPES
class TorchLlmArgs:
    model_fields = dict.fromkeys(ALLOWED["TorchLlmArgs"])
    def __init__(self, **kw):
        bad = set(kw) - set(self.model_fields)
        if bad: raise ValueError(f"TorchLlmArgs: extra inputs are not permitted: {{sorted(bad)}}")
        self.__dict__.update(kw)
def _decoding_config(data):
    from tensorrt_llm import llmapi
    data = dict(data)
    name = DECODING_TYPES.get(data.get("decoding_type"))
    if name is None:
        raise ValueError(f"Invalid decoding type: {{data.get('decoding_type')}}")
    return getattr(llmapi, name)(**data)
def update_llm_args_with_extra_options(llm_args, extra_llm_api_options):
    with open(extra_llm_api_options) as f:
        extra = yaml.safe_load(f)
    if "speculative_config" in extra:
        extra["speculative_config"] = _decoding_config(extra["speculative_config"])
    if "kv_cache_config" in extra:
        from tensorrt_llm import llmapi
        extra["kv_cache_config"] = llmapi.KvCacheConfig(**extra["kv_cache_config"])
    return llm_args | extra
'''
# trtllm-serve MODEL --tokenizer DIR --backend pytorch --host H --port P --extra_llm_api_options YAML: reads the YAML
# the way the real one does (the fake llm_args above; a rejection exits 1 with the reason), then answers /health and
# /v1/completions for the model named after MODEL's directory until it is stopped.
FAKE_SERVE = '''#!{python}
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1]
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs, update_llm_args_with_extra_options
try:
    merged = update_llm_args_with_extra_options({{"model": args[0], "tokenizer": opt("--tokenizer")}},
                                                opt("--extra_llm_api_options"))
    TorchLlmArgs(**merged)
    assert os.path.isdir(merged["speculative_config"].speculative_model), "draft dir not found"
except Exception as exc:
    print(f"trtllm-serve: {{type(exc).__name__}}: {{exc}}", file=sys.stderr)
    sys.exit(1)
name = os.path.basename(args[0])
class Handler(BaseHTTPRequestHandler):
    def _reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._reply(200, {{}}) if self.path == "/health" else self._reply(404, {{"error": self.path}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions" or body.get("model") != name:
            return self._reply(404, {{"error": f"no model {{body.get('model')}}"}})
        self._reply(200, {{"model": name, "choices": [{{"index": 0, "text": " Paris"}}]}})
    def log_message(self, *a): pass
HTTPServer((opt("--host"), int(opt("--port"))), Handler).serve_forever()
'''


def write_fake_packages(tmp_path: Path, line: str, gpu: bool = True, version: str | None = None) -> Path:
    """A dir for PYTHONPATH: a tensorrt_llm of `line` (strict configs, an LLM that echoes fixed tokens; FAKE_DIFFER
    makes speculative output differ; the trtllm-serve YAML path) and a torch that reports a GPU (or none); and
    <dir>/bin/trtllm-serve. `version`: the release it reports (default VERSIONS[line]); one below the Eagle3 floor
    parses decoding_type Eagle / DraftTarget only, as such releases do."""
    from eagle_trt.engine.trtllm_lines import EAGLE3_FLOOR, parse_release

    version = version or VERSIONS[line]
    fake = tmp_path / f"fake-{line.replace('+', '')}-{gpu}-{version}"
    (fake / "tensorrt_llm" / "llmapi").mkdir(parents=True)
    (fake / "torch").mkdir()
    (fake / "bin").mkdir()
    (fake / "torch" / "__init__.py").write_text(FAKE_TORCH.format(gpu=gpu))
    fields = {cls: line_fields(line, cls) for cls in ("Eagle3DecodingConfig", "DraftTargetDecodingConfig",
                                                      "TorchLlmArgs")}
    if parse_release(version) >= EAGLE3_FLOOR:
        types_ = {"Eagle3": "Eagle3DecodingConfig", "Draft_Target": "DraftTargetDecodingConfig"}
    else:
        types_ = {"Eagle": "Eagle3DecodingConfig", "DraftTarget": "DraftTargetDecodingConfig"}
    init = FAKE_TRTLLM.format(version=version, fields=repr(fields)) + f"DECODING_TYPES = {types_!r}\n"
    (fake / "tensorrt_llm" / "__init__.py").write_text(init)
    (fake / "tensorrt_llm" / "llmapi" / "__init__.py").write_text(FAKE_LLMAPI.format())
    (fake / "tensorrt_llm" / "llmapi" / "llm_args.py").write_text(FAKE_LLM_ARGS.format())
    import sys

    (fake / "bin" / "trtllm-serve").write_text(FAKE_SERVE.format(python=sys.executable))
    (fake / "bin" / "trtllm-serve").chmod(0o755)
    return fake
