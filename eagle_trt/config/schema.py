"""The eagle_config.yaml schema: one strict pydantic model that mirrors the YAML file key for key.

Validation is pure (it never touches disk), so `eagle-trt config check` and the builder's own
checks can run without a checkpoint. Everything that needs files (does the draft head fit the
target?) lives in eagle_trt.engine.builder.

    >>> from eagle_trt.config.schema import EagleConfig
    >>> cfg = EagleConfig.model_validate({"draft_length": 4, "total_tokens": 16})
    >>> (cfg.backend, cfg.dtype, cfg.with_dtype(lambda: False).resolved_kv_cache_dtype)
    ('torch', 'auto', 'float32')
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from eagle_trt.config.decode import MAX_LOOKUP_BRANCHES, MAX_LOOKUP_TOKENS, TreeSettings

__all__ = ["MAX_LOOKUP_BRANCHES", "MAX_LOOKUP_TOKENS", "DraftConfig", "EagleArchitecture", "EagleConfig"]

# strict=True: YAML already yields the right Python types, so "6" for an int or `yes` for a
# number is a typo to report, not something to coerce silently.
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def _cross(message: str) -> PydanticCustomError:
    # A custom error keeps the message verbatim (a plain ValueError gets a "Value error, " prefix).
    return PydanticCustomError("cross_field", message)


class EagleArchitecture(BaseModel):
    """Shape of the EAGLE-3 draft head; the builder checks it against the checkpoint."""

    model_config = _STRICT

    hidden_size: int = Field(gt=0, description="Draft hidden size; must equal the target model's hidden size.")
    num_attention_heads: int = Field(gt=0, description="Attention heads in the draft decoder layer.")
    intermediate_size: int = Field(gt=0, description="MLP intermediate size of the draft decoder layer.")
    num_hidden_layers: int = Field(gt=0, description="Decoder layers in the draft head (EAGLE-3 uses 1).")
    max_position_embeddings: int = Field(gt=0, description="Longest position the draft head supports.")


class DraftConfig(BaseModel):
    """What drafts for the target; the builder checks it against the checkpoint's draft/."""

    model_config = _STRICT

    kind: Literal["eagle3", "model"] = Field(
        description="eagle3: an EAGLE-3 head reading the target's layer features (`convert` attaches one); model: a "
        "small language model sharing the target's tokenizer, with its own KV cache (`convert --draft-model`). "
        "Both draft the same trees (draft_length, beam_width, total_tokens, confidence_threshold, tree).",
    )


class EagleConfig(TreeSettings):
    """Everything `eagle-trt build` and `eagle-trt run` need besides the checkpoint itself; the decode defaults
    (tree shape, prompt lookup) are `TreeSettings`, declared with the per-request settings in config/decode.py."""

    model_config = _STRICT

    name: str = Field(
        "smollm2-135m-eagle3",
        min_length=1,
        max_length=128,
        description="Engine name (letters, digits, . _ -); the default build output is engines/<name>.",
    )
    checkpoint_dir: str | None = Field(
        None, min_length=1, description="Output dir of `eagle-trt convert` (holds target/ and draft/)."
    )
    backend: Literal["torch", "trtllm"] = Field("torch", description="Runtime that executes the engine.")
    trtllm_version: Literal["1.2", "1.3+"] = Field(
        "1.3+",
        description='TensorRT-LLM release line a trtllm bundle is written for (backend trtllm only): "1.2" '
        "(1.2.0rc7 to 1.2.x, the stable line, and 1.3 rcs before rc10; its EAGLE-3 runs a chain of draft_length "
        "tokens, no trees) or \"1.3+\" (1.3.0rc10 and later, 1.4 and main: chain or dynamic tree). The bundle holds "
        "only fields that line defines. A quoted string in YAML.",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Engine weight dtype. auto: bfloat16 where it is the faster engine (backend trtllm, a GPU, or a "
        "CPU where the compiled kernels run: x86-64 with AVX2 and a C++ compiler), float32 elsewhere; `build` "
        "decides and the engine records the result. CPU: both lossless against plain decoding of the same dtype "
        "(their texts differ); bfloat16 streams half the weight bytes (fp32, bf16-dot or AMX math by CPU), float32 "
        "runs everywhere. GPU: float16 or bfloat16.",
    )
    weights: Literal["float", "auto", "q8_0", "q4_k", "q4_0", "q4_1", "q5_0", "q5_1"] = Field(
        "auto",
        description="How the target's projections and LM head are stored (embeddings and norms stay in dtype). float: "
        "in dtype. q8_0, q4_k, q4_0, q4_1, q5_0, q5_1: GGUF blocks that build quantizes from the checkpoint's float "
        "weights as llama.cpp's reference quantizers do (8.5, 4.5, 4.5, 5, 5.5, 6 bits a weight: fewer bytes a token "
        "reads; q4_k needs input sizes that are multiples of 256, the others of 32). auto: a GGUF's own blocks where convert kept them (no "
        "re-quantization: the model llama.cpp computes), else float; the default, so a GGUF builds into its own "
        "blocks unless told otherwise (backend trtllm: auto is float, TensorRT-LLM takes float weights). Block "
        "weights run on the CPU kernels' block projections (or the torch reference over gguf-py's de-quantized "
        "values); lossless against plain decoding of the same engine. Quantizing formats: backend torch only.",
    )
    block_compute: Literal["auto", "int8", "float"] = Field(
        "auto",
        description="How block weights (weights or draft_weights in GGUF blocks) compute on the CPU kernels. int8: "
        "each activation row quantized row-locally to int8 blocks and integer block dot products (llama.cpp's "
        "method; q8_0, q4_0, q4_k and q6_k weights, the others compute in float); float: each weight row "
        "de-quantized to fp32 and fp32 products. Both are lossless against plain decoding of the same engine (their "
        "texts differ slightly). auto: int8, the faster (docs/bench.md). `build` records the result. Backend torch "
        "only.",
    )
    draft_weights: Literal["float", "auto", "q8_0", "q4_k", "q4_0", "q4_1", "q5_0", "q5_1"] = Field(
        "auto",
        description="How the draft's projections are stored: an EAGLE-3 head's (fc, its layer, its own LM head) or a "
        "draft model's (its layers and LM head). float: in dtype; q8_0, q4_k, ...: build quantizes them (a cheaper "
        "draft step; the draft only proposes, so the output stays lossless whatever it is); auto (the default): a "
        "GGUF draft model's own blocks where convert --draft-model kept them, else float (backend trtllm: float). "
        "Quantizing formats: backend torch only.",
    )
    kv_cache_dtype: Literal["auto", "float32", "float16", "bfloat16", "fp8"] = Field(
        "auto",
        description="KV-cache dtype; auto means the same as dtype. fp8 (float8 e4m3 with per-layer scales "
        "calibrated by `convert`) works on both backends and stores 4x fewer KV bytes than fp32. LOSSY against a "
        "full-precision cache: it changes some greedy tokens (convert reports the agreement), and over an FP8 "
        "cache speculative output can differ from plain decoding where K/V rounding lands on an FP8 boundary.",
    )
    draft: DraftConfig | None = Field(
        None, description="What drafts: {kind: eagle3} or {kind: model}; omit (null) to take it from the checkpoint."
    )
    eagle_architecture: EagleArchitecture | None = Field(
        None, description="Draft head shape (EAGLE-3 heads only); omit (null) to derive it from the checkpoint."
    )
    max_batch_size: int = Field(1, ge=1, description="Largest batch the engine accepts.")
    max_input_len: int = Field(2048, ge=1, description="Longest prompt in tokens.")
    max_output_len: int = Field(512, ge=1, description="Most tokens generated per request.")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64,
        description="GPUs each layer of the target and draft is split across (backend trtllm: TensorRT-LLM's "
        "tensor_parallel_size; it must divide the attention heads). The torch engine runs on one device: 1.",
    )
    pipeline_parallel_size: int = Field(
        1, ge=1, le=64,
        description="Stages the target's layers are split into, one GPU group each (backend trtllm: TensorRT-LLM's "
        "pipeline_parallel_size; at most the number of layers). GPUs used: tensor x pipeline. The torch engine: 1.",
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # The name becomes a directory under engines/, so no separators and no hidden names.
        if not _NAME.fullmatch(value):
            raise PydanticCustomError(
                "engine_name",
                "must be a plain directory name: letters, digits, '.', '_' or '-', "
                "not starting with '.' or '-'",
            )
        return value

    @field_validator("trtllm_version", mode="before")
    @classmethod
    def _quoted_line(cls, value):
        # YAML reads an unquoted 1.2 as a float; say how to write it rather than "Input should be ...".
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise PydanticCustomError("trtllm_version", 'quote the line, e.g. trtllm_version: "1.2" (or "1.3+")')
        return value

    @property
    def resolved_kv_cache_dtype(self) -> str:
        """kv_cache_dtype with "auto" replaced by dtype (itself "auto" until `with_dtype` settles it)."""
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    @property
    def resolved_weights(self) -> str:
        """weights as build stores them: "auto" is "float" for backend trtllm (TensorRT-LLM takes float weights)."""
        return "float" if self.backend == "trtllm" and self.weights == "auto" else self.weights

    @property
    def resolved_draft_weights(self) -> str:
        """draft_weights as build stores them ("auto" is "float" for backend trtllm)."""
        return "float" if self.backend == "trtllm" and self.draft_weights == "auto" else self.draft_weights

    def with_dtype(self, fast_bf16: Callable[[], bool]) -> EagleConfig:
        """This config with dtype "auto" settled: bfloat16 for TensorRT-LLM or where `fast_bf16()` (asked only for a
        torch engine: does this machine run bf16 at full speed?), float32 otherwise. A set dtype stays."""
        if self.dtype != "auto":
            return self
        dtype = "bfloat16" if self.backend == "trtllm" or fast_bf16() else "float32"
        return self.model_copy(update={"dtype": dtype})

    @model_validator(mode="after")
    def _check_cross_fields(self) -> EagleConfig:
        if self.total_tokens < self.draft_length:
            raise _cross(f"total_tokens ({self.total_tokens}) must be >= draft_length ({self.draft_length})")
        if self.beam_width > self.total_tokens:
            raise _cross(
                f"beam_width ({self.beam_width}) must be <= total_tokens ({self.total_tokens})"
            )
        if self.draft is not None and self.draft.kind == "model" and self.eagle_architecture is not None:
            raise _cross("eagle_architecture describes an EAGLE-3 head, but draft.kind is 'model'; remove "
                         "eagle_architecture (or set it to null)")
        if self.backend == "trtllm" and self.draft_weights not in ("float", "auto"):
            raise _cross(f"draft_weights {self.draft_weights} is for backend torch (its CPU kernels); set "
                         "draft_weights: float")
        if self.backend == "trtllm" and self.block_compute != "auto":
            raise _cross(f"block_compute {self.block_compute} is for backend torch (its CPU kernels); set "
                         "block_compute: auto")
        if self.backend == "trtllm" and self.weights not in ("float", "auto"):
            raise _cross(f"weights {self.weights} is for backend torch (its CPU kernels); TensorRT-LLM takes float "
                         "weights: set weights: float")
        if self.static_tree is not None and self.tree != "static":
            raise _cross(f"static_tree is set but tree is {self.tree!r}; set tree: static or remove static_tree")
        if self.tree == "static":
            if not self.static_tree:
                raise _cross("tree is 'static' but static_tree is empty or missing")
            self._check_static_tree(self.static_tree)
        return self

    def _check_static_tree(self, paths: list[list[int]]) -> None:
        seen: set[tuple[int, ...]] = set()
        for i, path in enumerate(paths):
            key = tuple(path)
            if not key:
                raise _cross(f"static_tree[{i}] is empty; every path needs at least one rank")
            if key in seen:
                raise _cross(f"static_tree[{i}] {path} appears twice")
            seen.add(key)
        for i, path in enumerate(paths):
            # A node is reachable only through its parent, so every prefix must be a node too.
            for cut in range(1, len(path)):
                if tuple(path[:cut]) not in seen:
                    raise _cross(f"static_tree[{i}] {path} needs its prefix {path[:cut]} in static_tree")
            if len(path) > self.draft_length:
                raise _cross(
                    f"static_tree[{i}] {path} has depth {len(path)} > draft_length ({self.draft_length})"
                )
            if max(path) >= self.beam_width:
                raise _cross(
                    f"static_tree[{i}] {path} uses rank {max(path)} >= beam_width ({self.beam_width})"
                )
        if len(paths) > self.total_tokens:
            raise _cross(f"static_tree has {len(paths)} nodes > total_tokens ({self.total_tokens})")
