"""Draft trees as plain tensors: construction, masks, positions and retrieve indices.

A tree of N draft tokens is stored with the root (the token the target already chose, not yet in its
KV cache) at index 0 and every parent before its children:

    tokens   [N+1]        token id per node
    parents  [N+1]        parent index, -1 for the root
    depths   [N+1]        0 for the root; position of node i = prefix_len + depths[i]
    mask     [N+1, N+1]   mask[i, j] = j is i or an ancestor of i (what node i may attend to)
    retrieve [P, Dmax+1]  one row per leaf: the node indices root..leaf, padded with -1

    >>> t = tree_from_parents(torch.tensor([7, 8, 9]), torch.tensor([-1, 0, 0]))
    >>> t.retrieve.tolist()
    [[0, 1], [0, 2]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_trt.config.decode import DEFAULT_STATIC_TREE

__all__ = ["DEFAULT_STATIC_TREE", "StaticLayout", "Tree", "chain_choices", "select_top_nodes", "static_layout",
           "tree_from_parents", "trim_choices"]


class Tree:
    """A draft tree (see the module doc). tokens, parents and depths are built with it; mask and retrieve when first
    read (a drafted tree that prompt lookup then grafts onto is rebuilt, and never needs them)."""

    def __init__(self, tokens: torch.Tensor, lineage: list[list[int]]):
        self.tokens = tokens.long()
        self._lineage = lineage  # per node: its ancestors and itself, root first
        self.parents = torch.tensor([-1] + [line[-2] for line in lineage[1:]], dtype=torch.long)
        self.depths = torch.tensor([len(line) - 1 for line in lineage], dtype=torch.long)
        self._mask: torch.Tensor | None = None
        self._retrieve: torch.Tensor | None = None
        # Cumulative draft log-prob per node (root 0), where the drafter scored its nodes (dynamic trees).
        self.scores: list[float] | None = None

    @property
    def mask(self) -> torch.Tensor:
        if self._mask is None:
            n, lineage = len(self._lineage), self._lineage
            mask = torch.zeros(n, n, dtype=torch.bool)
            mask[[i for i, line in enumerate(lineage) for _ in line], [j for line in lineage for j in line]] = True
            self._mask = mask
        return self._mask

    @property
    def paths(self) -> list[list[int]]:
        """Node indices root..leaf of every leaf, in node order (the rows of `retrieve`, unpadded)."""
        is_parent = {line[-2] for line in self._lineage[1:]}
        return [line for i, line in enumerate(self._lineage) if i not in is_parent]

    @property
    def retrieve(self) -> torch.Tensor:
        if self._retrieve is None:
            dmax = self.depth
            self._retrieve = torch.tensor([p + [-1] * (dmax + 1 - len(p)) for p in self.paths], dtype=torch.long)
        return self._retrieve

    @property
    def size(self) -> int:
        """Draft tokens in the tree (root excluded)."""
        return self.tokens.numel() - 1

    @property
    def depth(self) -> int:
        return len(max(self._lineage, key=len)) - 1

    def positions(self, prefix_len: int) -> torch.Tensor:
        return self.depths + prefix_len


def tree_from_parents(tokens: torch.Tensor, parents: torch.Tensor | list[int]) -> Tree:
    """Build a tree (depths now; masks and retrieve indices when read); `parents[i] < i` for every non-root node."""
    n = tokens.numel()
    par = parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)
    if len(par) != n or par[0] != -1 or any(not (0 <= p < i) for i, p in enumerate(par) if i > 0):
        raise ValueError(f"parents must list the root first and every parent before its child: {par}")
    # Ancestor lists in plain Python (a tree has tens of nodes: per-node tensor ops would cost more than the work).
    lineage: list[list[int]] = [[0]]
    for i in range(1, n):
        lineage.append(lineage[par[i]] + [i])
    return Tree(tokens, lineage)


def select_top_nodes(
    scores: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    total_tokens: int,
    min_score: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2 rerank: keep the `total_tokens` candidates with the highest cumulative log-prob.

    Candidates are listed in creation order (every parent before its children, parent index -1 = root).
    A child's score is never above its parent's, and ties go to the shallower node, so the kept set is
    closed under ancestors. Returns (kept candidate indices in creation order, their parents as tree
    indices where the root is 0 and kept candidate j becomes node j+1).
    """
    sc, par, dep = scores.tolist(), parents.tolist(), depths.tolist()  # tens of candidates: plain Python
    # Sort by score desc, then depth asc, then creation order.
    order = sorted(range(len(sc)), key=lambda j: (-sc[j], dep[j], j))
    if min_score is not None:
        order = [j for j in order if sc[j] >= min_score]
    kept = sorted(order[:total_tokens])
    tree_index = {c: node for node, c in enumerate(kept, start=1)}
    tree_par = []
    for c in kept:
        p = par[c]
        if p >= 0 and p not in tree_index:  # cannot happen for cumulative log-probs; guards hand-made scores
            raise ValueError("selected nodes are not closed under ancestors")
        tree_par.append(0 if p < 0 else tree_index[p])
    return torch.tensor(kept, dtype=torch.long), torch.tensor(tree_par, dtype=torch.long)


# ---- static trees ---------------------------------------------------------------------------------

def chain_choices(length: int) -> list[list[int]]:
    return [[0] * d for d in range(1, length + 1)]


@dataclass
class StaticLayout:
    """A static tree from a choices list: node i (1-based, root 0) is the ranks[i]-th best child of parents[i]."""

    parents: torch.Tensor  # [N+1]
    ranks: torch.Tensor  # [N+1], root 0
    depths: torch.Tensor  # [N+1]

    @property
    def size(self) -> int:
        return self.parents.numel() - 1


def static_layout(choices: list[list[int]]) -> StaticLayout:
    """Order the choices breadth-first (parents before children) and index their parents."""
    paths = sorted({tuple(c) for c in choices}, key=lambda p: (len(p), p))
    index = {(): 0}
    parents, ranks, depths = [-1], [0], [0]
    for i, path in enumerate(paths, start=1):
        if not path or min(path) < 0:
            raise ValueError(f"tree choice {list(path)} must be a non-empty list of ranks >= 0")
        if path[:-1] not in index:
            raise ValueError(f"tree choice {list(path)} has no parent {list(path[:-1])} in the tree")
        index[path] = i
        parents.append(index[path[:-1]])
        ranks.append(path[-1])
        depths.append(len(path))
    return StaticLayout(torch.tensor(parents), torch.tensor(ranks), torch.tensor(depths))


def trim_choices(choices: list[list[int]], max_depth: int, max_nodes: int) -> list[list[int]]:
    """Keep the breadth-first first `max_nodes` choices no deeper than `max_depth` (ancestor-closed)."""
    paths = sorted({tuple(c) for c in choices if len(c) <= max_depth}, key=lambda p: (len(p), p))
    return [list(p) for p in paths[:max_nodes]]
