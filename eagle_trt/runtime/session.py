"""A loaded engine ready to generate: runner + tokenizer + the engine's defaults.

    session = Session.open("engines/smollm2-135m-eagle3")
    ids = session.encode("Write a haiku", chat=True)
    result = session.runner.generate(ids, session.decode_config(max_new_tokens=64))
    print(session.tokenizer.decode(result.token_ids))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from eagle_trt import private_cache
from eagle_trt.config import decode
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.engine.datastore_file import DATASTORE_NAME, read_datastore
from eagle_trt.engine.engine_dir import EngineDir, open_engine
from eagle_trt.eos import eos_from_files
from eagle_trt.errors import CheckpointError, InputError
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.kv_cache import resolve_kv_dtype
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.models.weight_cache import layouts_dir
from eagle_trt.models.weights import load_safetensors
from eagle_trt.prompt_sources import prompt_ids
from eagle_trt.runtime.model_drafter import DraftModel, ModelDrafter
from eagle_trt.runtime.runner import Runner
from eagle_trt.runtime.trtllm_runner import TrtllmRunner
from eagle_trt.timing import Clock, decision_clock
from eagle_trt.tokenizer import load_tokenizer

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Session:
    engine: EngineDir
    runner: Runner
    tokenizer: object

    @classmethod
    def open(cls, engine_path: str | Path, verify: bool = True, device: str = "cpu",
             just_written: bool = False, block_compute: str | None = None, clock: Clock | None = None,
             budget: bool | None = None) -> "Session":
        """just_written: `build` opening the engine it wrote a moment ago (see `open_engine`). block_compute: how block
        weights compute (float or int8), instead of the manifest's (for side-by-side benchmarks). clock: the
        runner's (eagle_trt/timing.py; a test's `TickClock` pins every timing-driven decision); by default the one
        `EAGLE_TRT_CLOCK` names, else the wall clock. budget: the step budget (runtime/budget.py) decides who drafts
        and cuts the trees; False: every request drafts its configured tree (what `tune` measures); by default on,
        except on a tick clock (`Runner`)."""
        private_cache.check_settings()  # a bad cache setting fails before anything loads
        clock = clock if clock is not None else decision_clock()
        engine = open_engine(engine_path, verify=verify, just_written=just_written)
        cfg = engine.config
        if cfg.backend != "torch":
            # Exit 3 with the install hint where TensorRT-LLM is absent, else generation goes through its LLM API
            # with the same CLI (runtime/trtllm_runner.py).
            return cls(engine, TrtllmRunner.open(engine), load_tokenizer(engine.tokenizer_dir))
        dtype = DTYPES[cfg.dtype]
        # The weights' runtime layout for this machine, made once and mapped afterwards (models/weight_cache.py).
        compute = block_compute or engine.manifest.block_compute
        target = LlamaTarget.load(engine.target_dir, dtype, cache=engine.weight_source("target"),
                                  block_compute=compute)
        kv_dtype = resolve_kv_dtype(cfg.kv_cache_dtype, dtype)
        scales = _kv_scales(Path(engine.root) / "kv_scales.safetensors")
        tree_room = decode.tree_room(cfg)  # the KV slots a step's tree may take
        capacity = cfg.max_input_len + cfg.max_output_len + tree_room
        head, drafter = None, None
        if engine.manifest.draft.kind == "model":  # a small LM drafts, with its own KV cache (model_drafter.py)
            draft = DraftModel.load(engine.draft_dir, dtype, cache=engine.weight_source("draft"), role="draft-model",
                                    block_compute=compute)
            drafter = ModelDrafter(draft, capacity, target.spec.vocab_size, kv_dtype)
        else:
            head = Eagle3DraftHead.load(engine.draft_dir, target, dtype, cache=engine.weight_source("draft"))
        tokenizer = load_tokenizer(engine.tokenizer_dir)
        runner = Runner(target, head, capacity=capacity,
                        kv_dtype=kv_dtype, k_scales=scales.get("target.k_scales"),
                        v_scales=scales.get("target.v_scales"), max_input_len=cfg.max_input_len,
                        draft_k_scales=scales.get("draft.k_scales"), draft_v_scales=scales.get("draft.v_scales"),
                        datastore=_datastore(Path(engine.draft_dir), target.spec.vocab_size),
                        eos_token_ids=eos_from_files(engine.target_dir, engine.tokenizer_dir, tokenizer=tokenizer),
                        tree_room=tree_room, drafter=drafter, clock=clock, budget=budget)
        return cls(engine, runner, tokenizer)

    @property
    def draft_kind(self) -> str:
        """What drafts: "eagle3" (a head) or "model" (a small LM); the manifest's word for it."""
        return self.engine.manifest.draft.kind

    @property
    def config(self):
        return self.engine.config

    @property
    def kernels(self) -> str:
        """The kernels the engine runs on, chosen when it was opened: amx, avx512, avx2 or torch (models/kernels.py);
        tensorrt-llm for a TensorRT-LLM engine."""
        kernels = getattr(getattr(self.runner, "target", None), "kernels", None)
        return kernels.name if kernels is not None else "tensorrt-llm"

    @property
    def weights(self) -> str:
        """How the engine stores its target's projections: float (in the engine dtype) or the GGUF block formats
        (q8_0, q4_k+q6_k); the manifest's word for it."""
        return self.engine.manifest.weights

    @property
    def block_compute(self) -> str | None:
        """How the block weights compute (int8 or float), None for an engine without any."""
        if self.weights == "float" and self.draft_weights == "float":
            return None
        kernels = getattr(getattr(self.runner, "target", None), "kernels", None)
        return getattr(kernels, "block_compute", None)

    @property
    def draft_weights(self) -> str:
        """The same for the draft (an EAGLE-3 head or a draft model)."""
        return self.engine.manifest.draft_weights

    @cached_property
    def tuned(self) -> dict:
        """Tree settings `eagle-trt tune` stored in the engine's tuned.json ({} when there are none).

        Only a tuned.json the manifest lists counts (its hash was checked on open, with verify)."""
        return read_tuned(self.engine.root, self.engine.manifest)

    def decode_config(self, tuned: bool = True, **request) -> DecodeConfig:
        """What a request decodes with: the engine's settings, then its tuned ones (unless tuned=False), then the
        request's own (None = not given), validated once (config/decode.py)."""
        cfg = self.config
        request.setdefault("max_new_tokens", None)
        if request["max_new_tokens"] is None:
            request["max_new_tokens"] = min(DecodeConfig.model_fields["max_new_tokens"].default, cfg.max_output_len)
        elif request["max_new_tokens"] > cfg.max_output_len:
            raise InputError(f"--max-new-tokens {request['max_new_tokens']} exceeds the engine's max_output_len "
                             f"{cfg.max_output_len}; rebuild with a larger max_output_len")
        return DecodeConfig.layered(cfg, self.tuned if tuned else {}, request)

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        check_prompt_text(prompt)
        # chat=False: exactly what `tokenizer(prompt).input_ids` gives, special tokens included.
        return prompt_ids(self.tokenizer, prompt, chat)


def warm_runtime_layout(engine: Path) -> str | None:
    """Open a just-built engine once, so the weight cache holds its runtime layout for this machine's kernels and the
    first `run` here maps it instead of making it (models/weight_cache.py). Returns the kernels' name, or None
    when the cache is off."""
    if layouts_dir() is None:
        return None
    # Hashed again: a layout is stored only from bytes proven to be the manifest's (models/weight_cache.py).
    return Session.open(engine, verify=True, just_written=True).runner.target.kernels.name


def check_prompt_text(prompt: str) -> None:
    """A prompt must be non-empty text; bytes that are not UTF-8 (a shell passes them through as surrogates) are an
    input error naming where they are, not a tokenizer crash."""
    if not prompt or not prompt.strip():
        raise InputError("the prompt is empty: give some text with --prompt")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"the prompt is not UTF-8 text (a byte that is not UTF-8 at character {e.start}); pass "
                         "UTF-8 text") from None


TUNED_NAME = "tuned.json"
TUNED_KEYS = ("tree", "draft_length", "beam_width", "total_tokens", "fallback_after", "lookup_tokens",
              "lookup_branches", "datastore_branches", "max_verify_rows", "confidence_threshold")


def read_tuned(root: str | Path, manifest) -> dict:
    """The DecodeConfig fields stored by `eagle-trt tune` in root/tuned.json, if the manifest lists it."""
    if TUNED_NAME not in manifest.files:
        return {}
    path = Path(root) / TUNED_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        out = {k: data[k] for k in TUNED_KEYS if k in data}
    except (OSError, ValueError, TypeError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable ({e})", hint="rerun `eagle-trt tune`") from None
    weights = getattr(manifest, "weights", "float")
    if isinstance(data, dict) and data.get("weights", weights) != weights:
        # The settings were chosen on another weight format's verify-cost curve.
        raise CheckpointError(f"{path}: tuned for {data['weights']} weights, the engine has {weights}",
                              hint="rerun `eagle-trt tune`")
    try:
        DecodeConfig.check_request(out)  # the bounds every decode setting has (config/decode.py)
    except InputError:
        raise CheckpointError(f"{path}: bad tuned settings {out}", hint="rerun `eagle-trt tune`") from None
    return out


def _datastore(draft_dir: Path, vocab_size: int):
    """The draft's lookup datastore (draft/datastore.safetensors), or None when the engine has none."""
    path = draft_dir / DATASTORE_NAME
    return read_datastore(path, vocab_size) if path.is_file() else None


def _kv_scales(path: Path) -> dict[str, torch.Tensor]:
    """FP8 KV scales: target.k_scales / target.v_scales [num_layers], draft.* [1]; {} when absent."""
    if not path.is_file():
        return {}
    return load_safetensors(path)


class TextStream:
    """Turns token chunks into printable text deltas (never splits a multi-byte character)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.printed = 0

    def push(self, tokens: list[int]) -> str:
        self.ids.extend(tokens)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta, self.printed = text[self.printed:], len(text)
        return delta
