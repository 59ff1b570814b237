"""What a model asks of its kernels: one interface, two implementations (models/kernels.py chooses between them).

- `TorchKernels` (models/reference.py): torch operators, the oracle.
- `NativeKernels` (models/native/kernels.py): the compiled CPU kernels, one call per forward.

"Kernels" is this layer's word; "backend" means what runs a whole engine (torch or TensorRT-LLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch


@dataclass(frozen=True)
class TargetStack:
    """A target's decoder stack as its kernels run it: the layers' weights (`LayerWeights`, models/llama.py), the
    final norm, and the compiled kernels' table of the same weights (None on the torch kernels)."""

    layers: Sequence[Any]
    norm: torch.Tensor
    table: Any = None


@dataclass(frozen=True)
class HeadStack:
    """An EAGLE-3 head's layer as its kernels run it: the head itself, and the compiled kernels' table of its weights
    (None on the torch kernels, or where the head's LM head is packed for another kernel)."""

    head: Any
    table: Any = None


@dataclass(frozen=True)
class Part:
    """One request's rows in a target forward: `rows` consecutive rows of the pass, whose K/V go to slots start..
    of its own `cache`, seeing the prefix and each other through `mask` ([rows, start + rows] bool, or None for one
    row; a sliding-window layer takes `window_mask` where it is set). A forward over several parts computes each
    part's rows as it would alone."""

    cache: Any
    start: int
    rows: int
    mask: torch.Tensor | None = None
    window_mask: torch.Tensor | None = None  # sliding-window layers' mask ([rows, start + rows]); None: `mask`


class Kernels(Protocol):
    name: str  # amx, avx512, avx2 or torch
    dtype: torch.dtype
    row_invariant: bool  # a verify row is bit-identical to decoding that token alone
    lm_head_rows: int  # rows the LM head scores in one pass over its weight
    reason: str | None  # why the compiled kernels do not serve, where they were wanted

    def fitted(self, inputs: Sequence[int]) -> Kernels:
        """These kernels for a model whose projections take these input sizes (the AMX tiles take only some)."""

    def projection(self, w: torch.Tensor) -> Any:
        """y = x @ w for w [in, out], packed for these kernels."""

    @property
    def cache_key(self) -> str:
        """What the packed layouts depend on (the weight cache's key, models/weight_cache.py)."""

    def projection_state(self, proj: Any) -> tuple[torch.Tensor, dict]: ...

    def projection_from_state(self, w: torch.Tensor, meta: dict) -> Any: ...

    def target_weights(self, layers: Sequence[Any], norm: torch.Tensor) -> TargetStack: ...

    def decoder_stack(self, weights: TargetStack, *, spec: Any, x: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor, parts: Sequence[Part], aux_layers: Sequence[int],
                      local_rope: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [T, hidden] embedded tokens of the parts' rows in order through every layer, each part's K/V into its
        own cache (the sliding-window layers, spec.local_layers, on local_rope's cos/sin) -> (final-normed hidden
        [T, hidden], the aux layers' outputs concatenated, or None)."""

    def draft_weights(self, head: Any) -> HeadStack: ...

    def draft_layer(self, weights: HeadStack, *, spec: Any, hidden: torch.Tensor, e: torch.Tensor, prenorm: bool,
                    cos: torch.Tensor, sin: torch.Tensor, parts: Sequence[Part],
                    last_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's layer over the parts' rows, each against its own head cache -> (draft logits: every row's, or
        each part's last with last_only; pre-norm output hidden)."""

    def greedy(self, lm_head: Any, hidden: torch.Tensor) -> torch.Tensor: ...

    def argmax(self, logits: torch.Tensor) -> torch.Tensor: ...

    def top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]: ...
