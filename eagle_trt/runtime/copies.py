"""Prompt-lookup copies during one request: the n-gram index kept current with the emitted text, the adaptive gate
(speculative/copy_gate.py) and grafting each step's copies onto the drafter's tree.

    copies = RequestCopies(prompt_ids, opts, datastore, row_price, greedy=True)
    emit = copies.wrap(emit)                              # every emitted token also goes into the index
    tree, copied = copies.graft(tree, room)               # before the verify pass
    copies.stepped(path, drafted, draft_s, verify_s, emitted)   # after it
"""

from __future__ import annotations

from typing import Callable

import torch

from eagle_trt.speculative.copy_gate import CopyGate, RowPrice
from eagle_trt.speculative.lookup import (NgramIndex, copied_chains, copy_budget, graft, shared_prefix,
                                          within_rows)
from eagle_trt.speculative.tree import Tree, tree_from_parents


class RequestCopies:
    def __init__(self, prompt_ids: list[int], opts, datastore, row_price: RowPrice, greedy: bool):
        """opts: the request's DecodeOptions (lookup_tokens > 0). The gate runs for greedy acceptance only."""
        self.opts, self.datastore, self.row_price = opts, datastore, row_price
        self.index = NgramIndex()
        self.index.extend(prompt_ids)
        gated = opts.adaptive_lookup and greedy and opts.posterior_threshold is None
        self.gate = CopyGate() if gated else None
        self._emitted = 0  # tokens the verify steps committed (accepted + bonus) and their time: a token's worth
        self._step_s = 0.0

    def wrap(self, emit: Callable[[list[int]], bool]) -> Callable[[list[int]], bool]:
        """`emit` that also keeps the index current with every emitted token."""

        def indexed_emit(tokens: list[int]) -> bool:
            self.index.extend(tokens)
            return emit(tokens)

        return indexed_emit

    def graft(self, tree: Tree, room: int) -> tuple[Tree, int]:
        """The tree with this step's copies grafted (cut by the gate where it runs, then to the row cap), and the node
        count before the datastore's."""
        opts = self.opts
        chains, more = copied_chains(self.index, self.datastore, min(opts.lookup_tokens, room), opts.lookup_branches,
                                     opts.datastore_branches)
        if self.gate is not None:
            token_ms = 1000 * self._step_s / self._emitted if self._emitted else None
            self.gate.prices(self.row_price.row_ms, token_ms)
            start, tokens, parents = len(self.index.tokens), tree.tokens.tolist(), tree.parents.tolist()
            chains, more = ([c for c in self.gate.cut(group, source, start,
                                                      [shared_prefix(tokens, parents, c) for c in group]) if c]
                            for source, group in enumerate((chains, more)))
        budget = copy_budget(opts.max_verify_rows, tree.tokens.numel())
        return with_lookup(tree, *within_rows(chains, more, budget))

    def stepped(self, path: torch.Tensor, drafted: int, step_s: float, committed: int) -> None:
        """After a verify step whose accepted path (node indices, root first) committed `committed` tokens in
        `step_s` seconds (drafting and verifying) and was emitted: nodes below `drafted` are the drafter's."""
        self._emitted += committed
        self._step_s += step_s
        if self.gate is not None:
            self.gate.stepped(int((path[1:] < drafted).sum()), self.index.tokens)


def with_lookup(tree: Tree, chains: list[list[int]], more: list[list[int]] = ()) -> tuple[Tree, int]:
    """The draft tree plus each prompt-lookup chain, then each of `more`, as one more path from the root (the
    same tree if they add nothing), built once. Also returns the node count before `more`'s nodes."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    for chain in chains:
        tokens, parents, _ = graft(tokens, parents, chain)
    boundary = len(tokens)
    for chain in more:
        tokens, parents, _ = graft(tokens, parents, chain)
    if len(tokens) == tree.tokens.numel():
        return tree, boundary
    return tree_from_parents(torch.tensor(tokens), torch.tensor(parents)), boundary
