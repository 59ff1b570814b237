"""What the decode loop (runtime/loop.py) keeps per request and per step: a request's place in the batch (`Slot`,
with its `State`) and what it puts into one shared forward (`Work`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

import torch

from eagle_trt.models.llama import Rows
from eagle_trt.runtime.proposers import DraftTree
from eagle_trt.runtime.request import Request
from eagle_trt.speculative.step_budget import DepthCalibration, DraftHistory, Probe


class State(enum.Enum):
    """Where an admitted request stands. (A request waiting for room is the caller's: the server's queue.)"""

    PREFILLING = "prefilling"  # its prompt goes into the KV cache, a chunk a step
    DECODING = "decoding"  # one token or one verified tree a step
    FINISHED = "finished"  # a stop: EOS, max_new_tokens, the context's end, a stop string
    CANCELLED = "cancelled"  # its caller left


@dataclass
class Slot:
    """One request's place in the batch: the request (with its own KV regions), its state and prefill progress, and
    the plain steps its drafter has yet to read."""

    request: Request
    kv_bytes: int
    drafting: bool
    admitted: float  # the loop clock's reading when the request joined
    cancelled: Callable[[], bool] | None = None
    state: State = State.PREFILLING
    prefilled: int = 0  # prompt tokens in the KV cache
    prompt_aux: list = field(default_factory=list)  # the prefill chunks' features (the drafter starts on them)
    # Plain steps of a drafting request (a fallback, or a step the budget left undrafted): their features and the
    # tokens that followed, which the drafter reads before it drafts again.
    behind_aux: list = field(default_factory=list)
    behind_tokens: list = field(default_factory=list)
    fallback_left: int = 0
    # The budget's measures of this request (runtime/budget.py; set on admission where a budget decides).
    history: DraftHistory | None = None
    calibration: DepthCalibration | None = None
    probe: Probe = field(default_factory=Probe)

    @property
    def prefilling(self) -> bool:
        return self.state is State.PREFILLING


@dataclass
class Work:
    """What one slot puts into this step's forward: `kind` prefill | plain | tree, its rows, and (tree) its draft."""

    slot: Slot
    kind: str
    rows: Rows | None  # a tree's: set once its copies are grafted
    draft: DraftTree | None = None
    draft_s: float = 0.0
    first_row: int = 0  # its first row in the pass
    values: list[float] | None = None  # a scored tree's calibrated node values before the budget's cut

    @property
    def n(self) -> int:
        return self.rows.tokens.numel()


def kv_scales(cache) -> tuple:
    """The FP8 scales a runner's cache was made with, for a request's own cache of the same kind."""
    return (torch.tensor(cache.k_scales), torch.tensor(cache.v_scales)) if cache.quantized else (None, None)
