"""Acceptance rules: which draft tokens the target keeps.

Greedy (T=0): the target's argmax at node i is the token it would emit after node i. Walk every
root-to-leaf path; the accepted path is the longest prefix whose tokens equal the argmax of their
parents, and the bonus token is the argmax after its last node. Output equals plain greedy decoding.
"""

from __future__ import annotations

import torch

from eagle_trt.speculative.tree import Tree


def verify_greedy(tree: Tree, target_next: torch.Tensor) -> tuple[torch.Tensor, int]:
    """target_next: [N+1] argmax of the target's logits at every node.

    Returns (accepted node indices root first, [m+1]; bonus token id)."""
    ri = tree.retrieve  # [P, D+1]
    child = ri[:, 1:]
    valid = child >= 0
    # A child node is right when its token is what the target emits after its parent.
    match = (tree.tokens[child.clamp(min=0)] == target_next[ri[:, :-1].clamp(min=0)]) & valid
    accepted = match.long().cumprod(dim=1).sum(dim=1)  # [P] accepted draft tokens per path
    best = int(accepted.argmax())
    m = int(accepted[best])
    path = ri[best, : m + 1]
    return path, int(target_next[path[-1]])
