"""TensorRT-LLM at run time: the only eagle-trt module that imports tensorrt_llm, and only lazily.

Importing this module is always safe; `require_tensorrt_llm()` is where the import happens, and it
raises MissingDependencyError (exit code 3) with the install hint when TensorRT-LLM is absent:

    >>> from eagle_trt.engine.trtllm_backend import validation_blocker
    >>> validation_blocker()  # doctest: +SKIP
    'TensorRT-LLM is not installed (No module named tensorrt_llm)'

Used by `eagle-trt build --backend trtllm` (load the bundle through `LLM(...)` to validate it, where
TensorRT-LLM and a CUDA GPU exist) and by `eagle-trt run` on a trtllm engine (generate through the
LLM API, PyTorch backend, with the metrics TensorRT-LLM reports per request).
"""

from __future__ import annotations

import atexit
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eagle_trt.engine.trtllm_bundle import LEGACY_DIR, OPTIONS_NAME, read_meta
from eagle_trt.engine.trtllm_lines import DEFAULT_LINE, LINES, line_for
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
        return f"TensorRT-LLM {version} is older than 1.2, the oldest line eagle-trt writes bundles for"
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


@dataclass
class TrtllmMetrics:
    """Per-request numbers TensorRT-LLM reports, under the keys `eagle-trt run` prints for torch."""

    mode: str
    prompt_tokens: int
    generated_tokens: int
    total_s: float
    stop_reason: str
    decoding_iterations: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    acceptance_rate: float = 0.0
    ttft_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        steps = self.decoding_iterations or max(self.generated_tokens, 1)
        return {
            "mode": self.mode, "backend": "trtllm",
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "verify_steps": steps,
            # TensorRT-LLM's acceptance length: tokens committed per decoding iteration.
            "acceptance_length": round(self.generated_tokens / steps, 4),
            "acceptance_per_depth": [],
            "tokens_per_second": round(self.generated_tokens / self.total_s, 3) if self.total_s > 0 else 0.0,
            "prefill_ms": round(self.ttft_s * 1e3, 2),  # time to first token
            "draft_ms": 0.0, "verify_ms": 0.0,  # TensorRT-LLM does not split them
            "total_ms": round(self.total_s * 1e3, 2),
            "mean_tree_size": round(self.draft_tokens / steps, 2),
            "tree_utilization": round(self.acceptance_rate, 4),
            "stop_reason": self.stop_reason,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "total_draft_tokens": self.draft_tokens, "total_accepted_draft_tokens": self.accepted_draft_tokens,
            **self.extra,
        }  # fmt: skip


@dataclass
class TrtllmResult:
    token_ids: list[int]
    metrics: TrtllmMetrics
    prompt_ids: list[int] = field(default_factory=list)


class TrtllmRunner:
    """`Runner`-compatible generate() that goes through TensorRT-LLM's LLM API."""

    def __init__(self, root: Path, options: dict):
        self.root, self.options = Path(root), options
        self._llm, self._key, self._tree = None, None, "none"

    @classmethod
    def open(cls, engine) -> "TrtllmRunner":
        require_tensorrt_llm()  # exit 3 with the install hint before anything else is loaded
        require_cuda()
        if (Path(engine.root) / LEGACY_DIR).is_dir():
            raise InputError(
                f"'{engine.root}' holds an EAGLE-1/2 head, which TensorRT-LLM runs as a TensorRT engine only",
                hint=f"build it with {LEGACY_DIR}/trtllm_build.sh, then run TensorRT-LLM's examples/run.py",
            )
        mismatch = line_mismatch(engine.root)
        if mismatch:
            raise InputError(mismatch)
        return cls(engine.root, read_options(engine.root))

    def _options_for(self, opts) -> tuple[dict, bool]:
        """The bundle's options with run-time tree and sampling settings, in the fields of the bundle's line."""
        line = LINES.get(bundle_line(self.root), LINES[DEFAULT_LINE])
        options = dict(self.options)
        spec = dict(options["speculative_config"])
        for key in ("use_dynamic_tree", "dynamic_tree_max_topK", "max_total_draft_tokens", "eagle_choices"):
            spec.pop(key, None)
        spec["max_draft_len"] = opts.draft_length
        if spec["decoding_type"] == "Draft_Target":  # a draft model drafts a chain on every line
            if getattr(opts, "posterior_threshold", None) is not None and opts.mode == "eagle":
                raise InputError("--posterior-threshold: TensorRT-LLM's Draft_Target has no typical acceptance; "
                                 "leave it out for lossless acceptance")
            options["speculative_config"] = spec
            return options, opts.mode == "eagle"
        if opts.tree == "static" and opts.mode == "eagle":
            raise InputError(f"--tree static: {line.releases} runs no static trees; use --tree chain"
                             + (" or dynamic" if line.runs_trees else ""))  # fmt: skip
        if opts.tree == "dynamic" and line.runs_trees:
            spec.update(use_dynamic_tree=True, dynamic_tree_max_topK=opts.beam_width,
                        max_total_draft_tokens=opts.total_tokens)  # fmt: skip
        # (a line without trees drafts a chain of max_draft_len whatever --tree says; the metrics say so)
        posterior = getattr(opts, "posterior_threshold", None)
        if posterior is not None and opts.mode == "eagle":
            if not line.typical_acceptance:
                raise InputError(f"--posterior-threshold: {line.releases} has no typical acceptance "
                                 "(posterior_threshold was removed); leave it out for lossless greedy acceptance")
            spec.update(greedy_sampling=False, posterior_threshold=posterior)  # lossy, opt-in
        if _temperature(opts) > 0 and "allow_advanced_sampling" in line.runtime_fields:
            spec["allow_advanced_sampling"] = True  # 1.2: non-greedy sampling with one-model speculation
        options["speculative_config"] = spec
        return options, opts.mode == "eagle"

    def _ensure(self, opts):
        options, speculative = self._options_for(opts)
        key = (yaml.safe_dump(options, sort_keys=True), speculative)
        if self._key != key:
            self.close()
            self._llm, self._key = load_llm(self.root, options, speculative), key
            spec = options["speculative_config"]
            self._tree = ("dynamic" if spec.get("use_dynamic_tree") else "chain") if speculative else "none"
            atexit.register(self.close)  # TensorRT-LLM's executor workers must be shut down
        return self._llm

    def generate(self, ids: list[int], opts, on_tokens=None) -> TrtllmResult:
        from tensorrt_llm import SamplingParams

        llm = self._ensure(opts)
        sampling = {"top_k": 1}  # greedy: the output equals the target's own greedy decoding
        if _temperature(opts) > 0:
            sampling = {"temperature": _temperature(opts), "top_p": getattr(opts, "top_p", 1.0)}
            if getattr(opts, "top_k", 0):
                sampling["top_k"] = opts.top_k
            if getattr(opts, "seed", None) is not None:
                sampling["seed"] = opts.seed
        try:
            params = SamplingParams(max_tokens=opts.max_new_tokens, return_perf_metrics=True, **sampling)
        except TypeError:  # releases that only take it on the LLM (the bundle's YAML sets both)
            params = SamplingParams(max_tokens=opts.max_new_tokens, **sampling)
        if opts.eos_token_ids:
            params.end_id = opts.eos_token_ids[0]
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": list(ids)}], params)[0]
        total = time.perf_counter() - start
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        if on_tokens is not None:
            on_tokens(tokens)
        metrics = TrtllmMetrics(mode=opts.mode, prompt_tokens=len(ids), generated_tokens=len(tokens), total_s=total,
                                stop_reason=str(completion.finish_reason or ""),
                                decoding_iterations=int(getattr(completion, "decoding_iter", 0) or 0),
                                extra={"temperature": _temperature(opts),
                                       "trtllm_tree": self._tree,
                                       "lossy": getattr(opts, "posterior_threshold", None) is not None
                                       and opts.mode == "eagle",
                                       "rejections": 0, "fallbacks": 0, "fallback_tokens": 0})  # fmt: skip
        perf = getattr(completion, "request_perf_metrics", None)
        spec = getattr(perf, "speculative_decoding", None)
        if spec is not None:
            metrics.draft_tokens = int(spec.total_draft_tokens)
            metrics.accepted_draft_tokens = int(spec.total_accepted_draft_tokens)
            metrics.acceptance_rate = float(spec.acceptance_rate)
        timing = getattr(perf, "timing_metrics", None)
        if timing is not None:
            metrics.ttft_s = _seconds(timing.first_token_time) - _seconds(timing.arrival_time)
        return TrtllmResult(token_ids=tokens, metrics=metrics, prompt_ids=list(ids))

    def close(self) -> None:
        if self._llm is not None:
            llm, self._llm, self._key = self._llm, None, None
            llm.shutdown()


def _temperature(opts) -> float:
    return float(getattr(opts, "temperature", 0.0) or 0.0)


def _seconds(value) -> float:
    """TensorRT-LLM timing fields are datetime.timedelta (or plain seconds)."""
    return float(value.total_seconds()) if hasattr(value, "total_seconds") else float(value or 0.0)
