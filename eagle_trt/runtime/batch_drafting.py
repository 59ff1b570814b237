"""Drafting for several requests at once: their EAGLE-3 drafters (one head, each request its own head KV cache)
grow their trees in lockstep and catch up on their accepted tokens together, each level of all the trees in one
head forward (`Eagle3DraftHead.batched_forward`).

    cands = grow_together(drafters, [(4, 6, None)] * len(drafters))   # (beam_width, depth, min_score) each
    extend_together(drafters, [aux_a, aux_b], [tokens_a, tokens_b])

The head's weights are read once per level for the whole batch instead of once per request; each request's rows
attend to its own cache only, so every tree is the one its drafter grows alone (the head only proposes: lossless
either way, and tests/test_batch.py checks the trees are equal).
"""

from __future__ import annotations

import torch

from eagle_trt.models.kernel_api import Part
from eagle_trt.runtime.drafter import Drafter
from eagle_trt.runtime.tree_drafter import Candidates


def batchable(drafters: list) -> bool:
    """Whether these drafters can share head forwards: EAGLE-3 drafters on one head."""
    return bool(drafters) and all(type(d) is Drafter for d in drafters) and len({id(d.head) for d in drafters}) == 1


def grow_together(drafters: list[Drafter], shapes: list[tuple[int, int, float | None]]) -> list[Candidates]:
    """Each drafter's beam expansion (`TreeDrafter.growth`, shapes: (beam_width, depth, min_score) each), every
    level of all of them in one head forward."""
    growths = [d.growth(*shape) for d, shape in zip(drafters, shapes)]
    out: list[Candidates | None] = [None] * len(drafters)
    asks = {}
    for i, g in enumerate(growths):
        _advance(g, None, i, asks, out, first=True)
    head = drafters[0].head if drafters else None
    while asks:
        order = list(asks)
        parts, positions, vis, hidden, tokens = [], [], [], [], []
        for i in order:
            state, carry, f_tokens, depth, parent_vis = asks[i]
            part, pos, v = drafters[i].expansion_rows(state, f_tokens, depth, parent_vis)
            parts.append(part)
            positions.append(pos)
            vis.append(v)
            hidden.append(carry)
            tokens.append(f_tokens)
        logits, h = head.batched_forward(torch.cat(hidden), torch.cat(tokens), torch.cat(positions), parts)
        row = 0
        for i, part, v in zip(order, parts, vis):
            rows = slice(row, row + part.rows)
            row += part.rows
            _advance(growths[i], (logits[rows], h[rows], v), i, asks, out)
    return out


def _advance(growth, result, i: int, asks: dict, out: list, first: bool = False) -> None:
    """Send one level's result to a growth (or start it): its next ask, or its Candidates once it is done."""
    try:
        asks[i] = next(growth) if first else growth.send(result)
    except StopIteration as done:
        asks.pop(i, None)
        out[i] = done.value


def extend_together(drafters: list[Drafter], auxes: list[torch.Tensor], tokens: list[torch.Tensor]) -> None:
    """`Drafter.extend` for each drafter (its verified features [T_i, F] and the tokens after them [T_i]), in one
    head forward: each request's rows see its committed prefix and, causally, each other."""
    head = drafters[0].head
    parts, positions = [], []
    for d, t in zip(drafters, tokens):
        n, k = d.cache.length, t.numel()
        mask = None
        if k > 1:
            mask = torch.cat([torch.ones(k, n, dtype=torch.bool), torch.ones(k, k, dtype=torch.bool).tril_()], 1)
        parts.append(Part(d.cache, n, k, mask))
        positions.append(torch.arange(n, n + k))
    logits, hidden = head.batched_forward(head.fuse(torch.cat(auxes)), torch.cat(tokens), torch.cat(positions),
                                          parts, last_only=True)
    row = 0
    for j, (d, part) in enumerate(zip(drafters, parts)):
        row += part.rows
        d.cache.length += part.rows
        d.last_logits, d.last_hidden = logits[j], hidden[row - 1]
