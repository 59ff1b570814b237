"""The verify-cost curve: what one target forward over T rows costs on this machine, per T.

A forward over T tokens reads the target's weights once for all T rows, so up to tens of rows a verify pass costs
little more than decoding one token, and past that the rows cost compute. `tune` reads the curve to choose tree
sizes; a batched server (runtime/loop.py) to decide, each step, how many rows its requests' trees may add.

    curve = forward_curve(target, default_sizes(256), aux_layers=runner.aux_layers)   # {rows: seconds}
"""

from __future__ import annotations

import torch

from eagle_trt.models.gemm import INVARIANT_ROWS
from eagle_trt.timing import Clock, median_seconds


def forward_curve(target, sizes: list[int], context: int = 128, reps: int = 5,
                  aux_layers: list[int] = (), clock: Clock | None = None) -> dict[int, float]:
    """Median seconds of one target forward over T new tokens after `context` cached tokens, per T, read on `clock`
    (eagle_trt/timing.py; the wall clock by default).

    Shapes match tree verification (the features of `aux_layers`, the runner's, and a [T, T] mask); T=1 is a plain
    decoding step."""
    g = torch.Generator().manual_seed(0)
    vocab = target.spec.vocab_size
    cache = target.new_cache(context + max(sizes) + 1)
    ctx = torch.randint(0, vocab, (context,), generator=g)
    target.forward(ctx, torch.arange(context), cache)
    cache.length = context
    out = {}
    for t in sorted(set(sizes)):
        tokens = torch.randint(0, vocab, (t,), generator=g)
        positions = torch.arange(context, context + t)
        mask = torch.ones(t, t, dtype=torch.bool).tril_()
        out[t] = median_seconds(lambda: target.forward(tokens, positions, cache, mask if t > 1 else None,
                                                     need_aux=bool(aux_layers), aux_layers=list(aux_layers)),
                              reps, clock=clock)
    return out


def default_sizes(limit: int) -> list[int]:
    """Tree sizes (root included) to measure: 1, 2, 4, 8, 12, 16, 17, 24, 32, 33, 48, 64, 65, ... up to limit.

    17 sits one row past the int8 tiles' 16-row chunk (csrc/gemm_int8_amx.cpp), 33 and 65 one row past a chunk of
    the bf16 projections (`INVARIANT_ROWS`): the cost jumps there, and without them the curve would spread the jump
    over 16..24, 32..48 and 64..96."""
    base = sorted({1, 2, 4, 8, 12, 16, 17, 24, 32, 48, 64, 96, 128, INVARIANT_ROWS + 1, 2 * INVARIANT_ROWS + 1})
    return [s for s in base if s <= limit] + ([limit] if limit not in base and limit > 1 else [])
