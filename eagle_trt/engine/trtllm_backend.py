"""TensorRT-LLM at run time: the only eagle-trt module that imports tensorrt_llm, and only lazily.

Importing this module is always safe; `require_tensorrt_llm()` is where the import happens, and it
raises MissingDependencyError (exit code 3) with the install hint when TensorRT-LLM is absent:

    >>> from eagle_trt.engine.trtllm_backend import validation_blocker
    >>> validation_blocker()  # doctest: +SKIP
    'TensorRT-LLM is not installed (No module named tensorrt_llm)'

Used by `eagle-trt build --backend trtllm` (load the bundle through `LLM(...)` to validate it, where
TensorRT-LLM and a CUDA GPU exist) and by the runtime's `TrtllmRunner` (runtime/trtllm_runner.py: `eagle-trt run`
on a trtllm engine generates through the LLM API, PyTorch backend, with the metrics TensorRT-LLM reports).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from eagle_trt.engine.trtllm_bundle import LEGACY_DIR, OPTIONS_NAME, read_meta
from eagle_trt.engine.trtllm_lines import line_for, refusal
from eagle_trt.errors import EagleError, InputError, MissingDependencyError

# The LLM API's config class for each decoding_type a bundle writes (tensorrt_llm.llmapi, both lines).
DECODING_CONFIGS = {"Eagle3": "Eagle3DecodingConfig", "Draft_Target": "DraftTargetDecodingConfig"}

INSTALL_HINT = (
    "pip install 'eagle-trt[trtllm]' on Linux x86-64/aarch64 with Python 3.10 or 3.12 and CUDA "
    "(TensorRT-LLM also needs an NVIDIA GPU and driver)"
)


def installed_version() -> str | None:
    """tensorrt-llm's version from package metadata (no import, so no CUDA needed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tensorrt-llm")
    except PackageNotFoundError:
        return None


def require_tensorrt_llm():
    """Import and return tensorrt_llm, or raise MissingDependencyError naming what is missing."""
    try:
        import tensorrt_llm
    except ModuleNotFoundError as exc:
        raise MissingDependencyError(f"TensorRT-LLM is not installed ({exc})", hint=INSTALL_HINT) from None
    except Exception as exc:  # noqa: BLE001 - a broken install fails in many ways (CUDA libs, MPI, stubs)
        raise MissingDependencyError(
            f"TensorRT-LLM is installed but `import tensorrt_llm` failed: {type(exc).__name__}: {exc}",
            hint=INSTALL_HINT,
        ) from None
    if not hasattr(tensorrt_llm, "LLM"):
        raise MissingDependencyError(
            f"the installed tensorrt_llm ({getattr(tensorrt_llm, '__file__', '?')}) has no LLM API: "
            "a placeholder package, not TensorRT-LLM",
            hint=INSTALL_HINT,
        )
    return tensorrt_llm


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise MissingDependencyError(
            "TensorRT-LLM needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False)",
            hint="run on a machine with an NVIDIA GPU, driver and a CUDA build of torch",
        )


def validation_blocker() -> str | None:
    """Why a build cannot be validated on TensorRT-LLM here, or None when it can."""
    try:
        require_tensorrt_llm()
        require_cuda()
    except MissingDependencyError as exc:
        return exc.message
    return None


def read_options(root: Path) -> dict:
    path = Path(root) / OPTIONS_NAME
    if not path.is_file():
        raise InputError(f"'{path}' not found: '{root}' holds no TensorRT-LLM LLM-API bundle")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def bundle_line(root: Path) -> str:
    """The TensorRT-LLM line a bundle was written for (bundles without trtllm.json predate lines: 1.2 names)."""
    meta = read_meta(root)
    return meta["trtllm_version"] if meta else "1.2"


def line_mismatch(root: Path, version: str | None = None) -> str | None:
    """Why the installed TensorRT-LLM cannot read this bundle's fields, or None when its line matches."""
    version = version or installed_version()
    want, have = bundle_line(root), line_for(version)
    if have is None:
        return refusal(version)
    if have.name != want:
        return (f"the bundle is for TensorRT-LLM {want} but {version} (line {have.name}) is installed: "
                f"rebuild it with --trtllm-version {have.name}")  # fmt: skip
    return None


def _field_names(cls) -> set[str]:
    """A pydantic model's field names and validation aliases."""
    names = set(cls.model_fields)
    for info in cls.model_fields.values():
        choices = getattr(getattr(info, "validation_alias", None), "choices", None) or []
        names |= {c for c in choices if isinstance(c, str)}
    return names


def llm_kwargs(root: Path, options: dict, speculative: bool = True) -> dict:
    """LLM(...) keyword arguments from the bundle's YAML: config objects built, paths made absolute.

    Every speculative field must exist in the installed decoding config (Eagle3DecodingConfig, or
    DraftTargetDecodingConfig for a draft model): the 1.3+ classes forbid unknown fields, and a missing one is named
    here in one line instead of in a validation dump."""
    from tensorrt_llm import llmapi

    root = Path(root).resolve()
    kwargs = {k: v for k, v in options.items() if k not in ("speculative_config", "kv_cache_config")}
    kwargs["kv_cache_config"] = llmapi.KvCacheConfig(**options.get("kv_cache_config", {}))
    if speculative and options.get("speculative_config"):
        spec = dict(options["speculative_config"])
        spec["speculative_model"] = str((root / spec["speculative_model"]).resolve())
        name = DECODING_CONFIGS[spec["decoding_type"]]
        unknown = sorted(set(spec) - _field_names(getattr(llmapi, name)))
        if unknown:
            raise InputError(
                f"the installed TensorRT-LLM {installed_version()} has no {name} field "
                f"{', '.join(unknown)} (bundle line {bundle_line(root)})",
                hint="rebuild the bundle with the --trtllm-version of the installed release",
            )
        kwargs["speculative_config"] = getattr(llmapi, name)(**spec)
    return kwargs


def load_llm(root: Path, options: dict, speculative: bool = True):
    """An LLM on the engine's target (+ its EAGLE-3 draft), PyTorch backend."""
    require_tensorrt_llm()
    require_cuda()
    from tensorrt_llm import LLM

    root = Path(root).resolve()
    try:
        kwargs = llm_kwargs(root, options, speculative)
        return LLM(model=str(root / "target"), tokenizer=str(root / "tokenizer"), **kwargs)
    except Exception as exc:  # noqa: BLE001 - report TensorRT-LLM's own reason in one line
        raise EagleError(f"TensorRT-LLM could not load '{root}': {type(exc).__name__}: {exc}") from exc


def validate_bundle(root: Path) -> dict:
    """Load the bundle with LLM(...) and generate a few tokens; {'validated': False, 'reason'} if impossible."""
    meta = read_meta(root) or {}
    status = {"validated": False, "tensorrt_llm": installed_version(), "reason": None,
              "trtllm_version": meta.get("trtllm_version", "1.2"), "tree": meta.get("tree")}  # fmt: skip
    if (Path(root) / LEGACY_DIR).is_dir():
        status["reason"] = "EAGLE-1/2 head: build the TensorRT engine with legacy_trt/trtllm_build.sh"
        return status
    status["reason"] = validation_blocker() or line_mismatch(root)
    if status["reason"] is not None:
        return status
    from tensorrt_llm import SamplingParams

    llm = load_llm(root, read_options(root))
    try:
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=4, top_k=1))
    finally:
        llm.shutdown()
    status.update(validated=True, reason=None)
    return status


def sampling_params(max_tokens: int, **sampling):
    """TensorRT-LLM's SamplingParams for one request, with per-request perf metrics where the release takes them."""
    from tensorrt_llm import SamplingParams

    try:
        return SamplingParams(max_tokens=max_tokens, return_perf_metrics=True, **sampling)
    except TypeError:  # releases that only take it on the LLM (the bundle's YAML sets both)
        return SamplingParams(max_tokens=max_tokens, **sampling)
