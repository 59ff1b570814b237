"""Generating through TensorRT-LLM's LLM API: a `Runner`-compatible `generate` for a trtllm engine.

    runner = TrtllmRunner.open(engine)            # exit 3 with the install hint where TensorRT-LLM is absent
    result = runner.generate(prompt_ids, config)  # config: a DecodeConfig; result.metrics under run's keys

TensorRT-LLM itself is imported only by engine/trtllm_backend.py, and only lazily; this module reaches it through
that one.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eagle_trt.timing import now
from eagle_trt.engine import trtllm_backend
from eagle_trt.engine.trtllm_bundle import LEGACY_DIR
from eagle_trt.engine.trtllm_lines import DEFAULT_LINE, LINES
from eagle_trt.errors import InputError


@dataclass
class TrtllmMetrics:
    """Per-request numbers TensorRT-LLM reports, under the keys `eagle-trt run` prints for torch."""

    mode: str
    prompt_tokens: int
    generated_tokens: int
    total_s: float
    stop_reason: str
    # The request's decoding iterations; None where TensorRT-LLM did not report them (0 is what it leaves
    # unreported): then tau is "not reported", never a made-up 1.0 or 0.
    decoding_iterations: int | None = None
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    acceptance_rate: float = 0.0
    ttft_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        reported = self.decoding_iterations is not None
        steps = self.decoding_iterations if reported else max(self.generated_tokens, 1)
        return {
            "mode": self.mode, "backend": "trtllm",
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "verify_steps": steps if reported else None,
            # TensorRT-LLM's acceptance length: tokens committed per decoding iteration.
            "acceptance_length": round(self.generated_tokens / steps, 4) if reported else None,
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
        trtllm_backend.require_tensorrt_llm()  # exit 3 with the install hint before anything else is loaded
        trtllm_backend.require_cuda()
        if (Path(engine.root) / LEGACY_DIR).is_dir():
            raise InputError(
                f"'{engine.root}' holds an EAGLE-1/2 head, which TensorRT-LLM runs as a TensorRT engine only",
                hint=f"build it with {LEGACY_DIR}/trtllm_build.sh, then run TensorRT-LLM's examples/run.py",
            )
        mismatch = trtllm_backend.line_mismatch(engine.root)
        if mismatch:
            raise InputError(mismatch)
        return cls(engine.root, trtllm_backend.read_options(engine.root))

    def _options_for(self, opts) -> tuple[dict, bool]:
        """The bundle's options with run-time tree and sampling settings, in the fields of the bundle's line."""
        line = LINES.get(trtllm_backend.bundle_line(self.root), LINES[DEFAULT_LINE])
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
            self._llm, self._key = trtllm_backend.load_llm(self.root, options, speculative), key
            spec = options["speculative_config"]
            self._tree = ("dynamic" if spec.get("use_dynamic_tree") else "chain") if speculative else "none"
            atexit.register(self.close)  # TensorRT-LLM's executor workers must be shut down
        return self._llm

    def generate(self, ids: list[int], opts, on_tokens=None) -> TrtllmResult:
        llm = self._ensure(opts)
        sampling = {"top_k": 1}  # greedy: the output equals the target's own greedy decoding
        if _temperature(opts) > 0:
            sampling = {"temperature": _temperature(opts), "top_p": getattr(opts, "top_p", 1.0)}
            if getattr(opts, "top_k", 0):
                sampling["top_k"] = opts.top_k
            if getattr(opts, "seed", None) is not None:
                sampling["seed"] = opts.seed
        params = trtllm_backend.sampling_params(opts.max_new_tokens, **sampling)
        if opts.eos_token_ids:
            params.end_id = opts.eos_token_ids[0]
        start = now()
        out = llm.generate([{"prompt_token_ids": list(ids)}], params)[0]
        total = now() - start
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        if on_tokens is not None:
            on_tokens(tokens)
        metrics = TrtllmMetrics(mode=opts.mode, prompt_tokens=len(ids), generated_tokens=len(tokens), total_s=total,
                                stop_reason=str(completion.finish_reason or ""),
                                # On the request's output (GenerationResult), not on its CompletionOutput.
                                decoding_iterations=reported_count(getattr(out, "decoding_iter", None)),
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


def reported_count(value) -> int | None:
    """A counter TensorRT-LLM may leave at 0 when it does not report it: None then, else the count."""
    try:
        n = int(value or 0)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _temperature(opts) -> float:
    return float(getattr(opts, "temperature", 0.0) or 0.0)


def _seconds(value) -> float:
    """TensorRT-LLM timing fields are datetime.timedelta (or plain seconds)."""
    return float(value.total_seconds()) if hasattr(value, "total_seconds") else float(value or 0.0)
