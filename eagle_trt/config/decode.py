"""The decode settings, declared once: names, defaults, bounds and the checks between them.

`TreeSettings` is what an engine fixes as its defaults (eagle_config.yaml holds it, `EagleConfig` inherits it);
`DecodeConfig` adds what each request chooses. A request's settings are layered, lowest first:

    engine config -> tuned.json (`eagle-trt tune`) -> the request's own (CLI flags, an API call)

and validated once, by `DecodeConfig.layered`:

    >>> base = TreeSettings(beam_width=4)
    >>> cfg = DecodeConfig.layered(base, {"total_tokens": 16}, {"temperature": 0.7, "seed": 1})
    >>> (cfg.beam_width, cfg.total_tokens, cfg.temperature, cfg.lookup_tokens)
    (4, 16, 0.7, 8)
    >>> DecodeConfig.layered(base, {}, {"top_p": 1.5})
    Traceback (most recent call last):
    ...
    eagle_trt.errors.InputError: --top-p must be in (0, 1], got 1.5
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from eagle_trt.errors import InputError

Rank = Annotated[int, Field(ge=0)]
MAX_LOOKUP_TOKENS = 32
MAX_LOOKUP_BRANCHES = 8
MIN_TEMPERATURE = 1e-5  # below it logits / T overflow float32 long before it samples anything but the argmax
MAX_SEED = 2**64 - 1  # torch generators take 64-bit seeds
# The fewest slots a step's tree may take at run time beyond the engine's own settings (see `tree_room`).
ROOM_FLOOR = 64
# tree: static without a static_tree: 21 nodes by top-k rank below each node, wide near the root where the draft is
# least sure, one deep chain where it is most sure.
DEFAULT_STATIC_TREE: list[list[int]] = [
    [0], [1], [2], [3],
    [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0],
    [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 2],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
    [0, 0, 0, 0, 0, 0],
]
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class TreeSettings(BaseModel):
    """How each step's draft tree is shaped and which copies are grafted onto it; an engine's defaults."""

    model_config = _STRICT

    tree: Literal["dynamic", "static", "chain"] = Field(
        "dynamic", description="Tree shape: dynamic (EAGLE-3), static (static_tree) or chain (no branching)."
    )
    draft_length: int = Field(6, ge=1, le=32, description="Draft tree depth (draft steps per iteration).")
    # `max_beam_width` is read too: the name of this field in configs and manifests written before it was renamed.
    # (TensorRT-LLM's own max_beam_width is beam search, not the tree's top-k.)
    beam_width: int = Field(
        8, ge=1, le=64, validation_alias=AliasChoices("beam_width", "max_beam_width"),
        description="Top-k children expanded per draft node (the dynamic tree's beam).",
    )
    total_tokens: int = Field(32, ge=1, le=512, description="Draft tokens in the tree, root excluded.")
    confidence_threshold: float = Field(
        0.0, ge=0.0, lt=1.0, description="Verify only the draft candidates whose cumulative draft probability is at "
        "least this (0 = the whole tree): a step where the drafter is unsure verifies fewer rows, down to a plain "
        "step. Pays where each verify row costs (4-bit weights on CPUs without AMX); `eagle-trt tune` chooses it. "
        "Lossless either way."
    )
    static_tree: list[list[Rank]] | None = Field(
        None, description="Tree paths by top-k rank, e.g. [[0], [0, 0], [1]]; only with tree: static."
    )
    lookup_tokens: int = Field(
        8, ge=0, le=MAX_LOOKUP_TOKENS,
        description="Prompt lookup: graft up to this many tokens copied from the context (what followed an earlier "
        "occurrence of the last 1-3 tokens) onto every draft tree, verified in the same pass; 0 = off. Lossless; "
        "helps code, extraction and any answer that repeats itself or the prompt.",
    )
    lookup_branches: int = Field(
        2, ge=1, le=MAX_LOOKUP_BRANCHES,
        description="Distinct copied continuations per draft tree (each up to lookup_tokens long).",
    )
    datastore_branches: int = Field(
        1, ge=0, le=MAX_LOOKUP_BRANCHES,
        description="Continuations (up to lookup_tokens long) taken from the draft's datastore, the text its "
        "training data holds, in addition to the context's: the most frequent ones after the last 2-4 tokens. "
        "Used only by engines whose draft/ has a datastore.safetensors and with lookup_tokens > 0; 0 = off.",
    )
    max_verify_rows: int = Field(
        0, ge=0, le=4096,
        description="Cut the prompt-lookup copies so that one verify pass holds at most this many tokens (the root, "
        "the draft tree and the copies); 0 = no cut. Verify cost can jump at a row count (bf16 on CPU: every 32 "
        "rows take another pass over the weights); `eagle-trt tune` chooses it.",
    )
    adaptive_lookup: bool = Field(
        True,
        description="Greedy decoding: cut each copy where what it has been earning in this request (tokens accepted "
        "beyond the head's path) stops paying for its verify rows on this machine; the copies still come from "
        "lookup_tokens/branches. Lossless; false = always graft them whole.",
    )
    def tree_capacity(self) -> int:
        """The most tree nodes (root and copies included) one step can hold with these settings: the KV slots and
        draft scratch slots a step needs."""
        drafted = max(self.total_tokens, self.beam_width * self.draft_length, len(DEFAULT_STATIC_TREE))
        return drafted + 1 + self.lookup_tokens * (self.lookup_branches + self.datastore_branches)


def drafted_room(engine: TreeSettings) -> int:
    """Drafted nodes a step may take in an engine's KV cache: its own settings' trees, or at least `ROOM_FLOOR`."""
    return max(engine.total_tokens, engine.beam_width * engine.draft_length, ROOM_FLOOR)


def copied_room(engine: TreeSettings) -> int:
    """Copied (prompt-lookup) nodes a step may take in an engine's KV cache, at least `ROOM_FLOOR`."""
    return max(engine.lookup_tokens * (engine.lookup_branches + engine.datastore_branches), ROOM_FLOOR)


def tree_room(engine: TreeSettings) -> int:
    """KV slots an engine sets aside for one step's tree (root, drafted and copied nodes), with room for run-time
    options above its own settings."""
    return drafted_room(engine) + 1 + copied_room(engine)


class DecodeConfig(TreeSettings):
    """Everything one request decodes with: the tree settings plus what the request itself chooses."""

    max_new_tokens: int = Field(128, ge=1, description="Stop after this many new tokens.")
    mode: Literal["eagle", "ar"] = Field(
        "eagle", description="eagle: speculative decoding with the engine's drafter; ar: plain decoding.")
    eos_token_ids: list[int] | None = Field(None, description="Tokens that end the answer; None: the engine's.")
    # Sampling (temperature 0 = greedy). The target's processed distribution is the same in every mode.
    temperature: float = Field(0.0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (1 = off).")
    top_k: int = Field(0, ge=0, description="Keep the k most likely target tokens (0 = off).")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="Random seed for sampling.")
    posterior_threshold: float | None = Field(
        None, gt=0.0, le=1.0, description="Typical acceptance: LOSSY, opt-in (None = exact verification).")
    posterior_alpha: float = Field(0.3, gt=0.0, le=1.0, description="Typical acceptance's entropy factor.")
    fallback_after: int = Field(
        2, ge=0, le=1024, description="After this many verify steps in a row with no draft token accepted, decode "
        "fallback_tokens plainly, then draft again (0 = never). Lossless either way.")
    fallback_tokens: int = Field(8, ge=1, le=4096, description="Tokens decoded plainly per fallback.")

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, t: float) -> float:
        if not math.isfinite(t) or t < 0 or 0 < t < MIN_TEMPERATURE:
            raise PydanticCustomError("temperature", f"must be 0 (greedy) or a finite value >= {MIN_TEMPERATURE:g}")
        return t

    @model_validator(mode="after")
    def _dynamic_tree(self) -> DecodeConfig:
        if self.tree == "dynamic" and self.total_tokens < self.draft_length:
            raise PydanticCustomError(
                "tree_shape", f"--total-tokens ({self.total_tokens}) must be >= --draft-length ({self.draft_length})")
        return self

    @property
    def lossy(self) -> bool:
        return self.posterior_threshold is not None and self.mode == "eagle"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def check_request(cls, request: dict) -> None:
        """Each setting a request gives (None = not given), checked alone before anything loads; how they combine
        with the engine's is `layered`'s to check."""
        for name, value in request.items():
            if value is None:
                continue
            try:
                cls.model_validate({name: value})
            except ValidationError as e:
                if e.errors()[0]["type"] != "tree_shape":
                    raise InputError(describe(e, {name: value})) from None

    @classmethod
    def layered(cls, engine: TreeSettings | dict, tuned: dict, request: dict) -> DecodeConfig:
        """The engine's settings, then tuned.json's, then the request's (None = not given), validated once."""
        base = engine.model_dump(include=set(TreeSettings.model_fields)) if isinstance(engine, BaseModel) else engine
        merged = {**base, **tuned, **{k: v for k, v in request.items() if v is not None}}
        try:
            return cls.model_validate(merged)
        except ValidationError as e:
            raise InputError(describe(e, merged)) from None


def describe(error: ValidationError, values: dict) -> str:
    """A validation error as the one-line message a CLI user needs: the flag, what it must be, what it got."""
    first = error.errors()[0]
    loc = [str(x) for x in first["loc"]]
    if not loc:  # a check between fields states its own flags
        return first["msg"]
    name = loc[0]
    flag = "--" + name.replace("_", "-")
    got = values.get(name, first.get("input"))
    bounds = _bounds(name)
    if first["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") and bounds:
        return f"{flag} must be {bounds}, got {got}"
    if first["type"] == "literal_error":
        return f"{flag} must be {first['ctx']['expected']}, got {got!r}"
    return f"{flag} {first['msg'][0].lower()}{first['msg'][1:]}, got {got}"


def _bounds(name: str) -> str | None:
    """A field's bounds as a CLI message states them: '>= 1', 'in [0, 32]', 'in (0, 1]'."""
    info = DecodeConfig.model_fields.get(name)
    if info is None:
        return None
    lo = hi = None
    for m in info.metadata:
        for attr, side, bracket in (("ge", "lo", "["), ("gt", "lo", "("), ("le", "hi", "]"), ("lt", "hi", ")")):
            value = getattr(m, attr, None)
            if value is not None:
                if side == "lo":
                    lo = (bracket, value)
                else:
                    hi = (bracket, value)
    if lo and hi:
        return f"in {lo[0]}{lo[1]:g}, {hi[1]:g}{hi[0]}" if name != "seed" else "in [0, 2**64 - 1]"
    if lo:
        return f"{'>=' if lo[0] == '[' else '>'} {lo[1]:g}"
    if hi:
        return f"{'<=' if hi[0] == ']' else '<'} {hi[1]:g}"
    return None
