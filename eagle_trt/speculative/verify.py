"""Acceptance rules: which draft tokens the target keeps.

Greedy (T=0): the target's argmax at node i is the token it would emit after node i. Walk every
root-to-leaf path; the accepted path is the longest prefix whose tokens equal the argmax of their
parents, and the bonus token is the argmax after its last node. Output equals plain greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_trt.speculative.tree import Tree


def verify_greedy(tree: Tree, target_next: torch.Tensor) -> tuple[torch.Tensor, int]:
    """target_next: [N+1] argmax of the target's logits at every node.

    Returns (accepted node indices root first, [m+1]; bonus token id)."""
    # Tens of nodes: plain Python lists beat a dozen small tensor ops.
    tokens, nxt = tree.tokens.tolist(), target_next.tolist()
    best, m = None, -1
    for row in tree.paths:  # root..leaf
        a = 0
        # A child node is right when its token is what the target emits after its parent.
        while a + 1 < len(row) and tokens[row[a + 1]] == nxt[row[a]]:
            a += 1
        if a > m:  # the first path with the most accepted tokens
            best, m = row, a
    path = torch.tensor(best[: m + 1], dtype=torch.long)
    return path, int(nxt[best[m]])


# ---- sampling (T > 0) ----------------------------------------------------------------------------

def remove_rejected(p: torch.Tensor, token: int) -> torch.Tensor:
    """Residual after rejecting a deterministic draft token x (q = point mass on x):
    norm(max(0, p - q)) = p with x zeroed, renormalised."""
    p = p.clone()
    p[token] = 0.0
    total = p.sum()
    return p / total if total > 0 else p


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Residual after rejecting a token drawn from q: norm(max(0, p - q))."""
    r = (p - q).clamp_min_(0.0)
    total = r.sum()
    return r / total if total > 0 else r


def children_lists(tree: Tree) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(tree.tokens.numel())]
    for node, parent in enumerate(tree.parents.tolist()):
        if parent >= 0:
            kids[parent].append(node)  # tree order = draft order (best-ranked sibling first)
    return kids


@dataclass
class SampleOutcome:
    path: torch.Tensor  # accepted nodes, root first
    bonus: int
    rejections: int  # sibling tries that were rejected


def verify_sampling(tree: Tree, probs: torch.Tensor, generator: torch.Generator | None,
                    posterior_threshold: float | None = None, posterior_alpha: float = 0.3,
                    proposals: dict[int, torch.Tensor] | None = None) -> SampleOutcome:
    """Multi-branch rejection sampling over a tree of draft tokens.

    probs: [N+1, V] the target's processed distribution after each node. proposals: node -> the distribution q
    [V] its token was drawn from (a drafter that samples); every other node is a point mass (a top-k pick, a
    copied prompt-lookup token). At the current node try its children in draft order: accept child x with
    probability min(1, p(x)/q(x)) (= p(x) for a point mass); on rejection p <- norm(max(0, p - q)). If no child is
    accepted, the bonus token is drawn from what is left of p. Each rejection leaves p as the target's
    distribution given that rejection, whatever proposal the next child came from, so every emitted token is
    distributed exactly as p: plain sampling from p that checks the drafted candidates first.

    posterior_threshold (LOSSY, opt-in): typical acceptance instead — accept the first child whose
    target probability exceeds min(threshold, alpha * exp(-entropy(p))); the bonus is sampled from p.
    """
    kids = children_lists(tree)
    tokens = tree.tokens.tolist()
    node, path, rejections = 0, [0], 0
    while True:
        p = probs[node]
        chosen = None
        if posterior_threshold is not None:
            entropy = -(p * torch.log(p.clamp_min(1e-20))).sum()
            bar = min(posterior_threshold, posterior_alpha * float(torch.exp(-entropy)))
            chosen = next((c for c in kids[node] if float(p[tokens[c]]) > bar), None)
            rejections += len(kids[node]) if chosen is None else kids[node].index(chosen)
        else:
            for c in kids[node]:
                x = tokens[c]
                q = proposals.get(c) if proposals else None
                ratio = float(p[x]) if q is None else min(1.0, float(p[x]) / float(q[x]))
                if float(torch.rand((), generator=generator)) < ratio:
                    chosen = c
                    break
                rejections += 1
                p = remove_rejected(p, x) if q is None else residual(p, q)
        if chosen is None:
            bonus = int(torch.multinomial(p, 1, generator=generator))
            return SampleOutcome(torch.tensor(path), bonus, rejections)
        path.append(chosen)
        node = chosen
