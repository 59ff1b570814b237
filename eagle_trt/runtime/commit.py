"""What one request does with its verified tree, whatever else shared the forward: accept the longest path the target
agrees with, then commit it (keep the path's K/V, emit its tokens, record the step).

    accepted = accept(target, request, draft, Verified(hidden, aux), target_next)
    feed = commit(request, draft, verified, accepted, draft_s, verify_s)    # what the drafter reads next, or None

Greedy acceptance keeps exactly the target's argmax chain, so the committed tokens are `--mode ar`'s; at T > 0 (or
with typical acceptance) multi-branch rejection sampling keeps the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_trt.runtime.metrics import StepRecord
from eagle_trt.runtime.proposers import CONTEXT, DATASTORE, DRAFTER, DraftTree
from eagle_trt.runtime.request import Request
from eagle_trt.speculative.sampling import processed_probs
from eagle_trt.speculative.verify import verify_greedy, verify_sampling


@dataclass
class Verified:
    """The target's forward over one step's tree: hidden states [N, H] and, for a drafter that reads them, the
    features [N, F] (None otherwise)."""

    hidden: torch.Tensor
    aux: torch.Tensor | None


@dataclass
class Accepted:
    """What verification kept: the path (node indices, root first; also as a list), the bonus token after it, and the
    accepted draft tokens (the path's tokens after the root)."""

    path: torch.Tensor
    nodes: list[int]
    bonus: int
    tokens: list[int]


def accept(target, request: Request, draft: DraftTree, verified: Verified,
           target_next: torch.Tensor | None) -> Accepted:
    """Greedy: the longest path the target's argmax agrees with (`target_next`: the argmax after each node, -1 where
    it was not scored); at T > 0 (or with typical acceptance), multi-branch rejection sampling."""
    tree, hidden, cfg = draft.tree(), verified.hidden, request.config
    if request.greedy_acceptance:
        path, bonus = verify_greedy(tree, target_next)
        if bonus < 0:  # the path ends on a leaf whose argmax was not scored with the tree
            bonus = int(target.greedy(hidden[path[-1:]])[0])
    else:
        logits = target.logits(hidden)
        p = processed_probs(logits, request.sampling) if not request.greedy else torch.softmax(logits.float(), -1)
        outcome = verify_sampling(tree, p, request.generator, cfg.posterior_threshold, cfg.posterior_alpha,
                                  draft.proposals)
        request.metrics.rejections += outcome.rejections
        path, bonus = outcome.path, outcome.bonus
    return Accepted(path, path.tolist(), bonus, tree.tokens[path[1:]].tolist())


def scored_rows(tree_size: int, parents: torch.Tensor, lm_head_rows: int) -> torch.Tensor | None:
    """The tree rows whose argmax greedy acceptance reads (None: all of them). The LM head is one pass over its weight
    for up to `lm_head_rows` rows, so a tree that fits is scored whole, leaves included (the bonus then needs no
    second pass); a larger one only where a child is checked (the root and inner nodes)."""
    if tree_size <= lm_head_rows:
        return None
    return torch.unique(torch.cat([parents[1:], torch.zeros(1, dtype=torch.long)]))


def commit(request: Request, draft: DraftTree, verified: Verified, accepted: Accepted, draft_s: float,
           verify_s: float) -> tuple[torch.Tensor | None, torch.Tensor] | None:
    """Keep the accepted path's K/V (packed right after the prefix; the rest is dead space), emit its tokens and
    record the step. Returns what the request's drafter reads next (the path's features, its tokens and the bonus),
    or None once the request is over."""
    n = request.cache.length
    request.cache.compact(n, accepted.path)
    request.cache.length = n + accepted.path.numel()
    kept = request.commit(accepted.tokens + [accepted.bonus])
    request.metrics.steps.append(_record(draft, accepted, kept, request.carry_draft_s + draft_s, verify_s))
    request.misses = request.misses + 1 if not accepted.tokens else 0
    if request.done:
        return None
    request.committed_tokens += len(accepted.tokens) + 1
    request.committed_s += request.carry_draft_s + draft_s + verify_s
    if request.gate is not None:
        request.gate.stepped(draft.accepted_from(accepted.nodes[1:], DRAFTER), request.index.tokens)
    request.root = accepted.bonus
    aux = verified.aux[accepted.path] if verified.aux is not None else None
    return aux, torch.tensor(accepted.tokens + [accepted.bonus])


def _record(draft: DraftTree, accepted: Accepted, kept: int, draft_s: float, verify_s: float) -> StepRecord:
    """A verify step's metrics. `kept`: the tokens it committed (accepted + bonus, fewer when a stop fell inside
    them): tau counts only those, and the copies' share is capped by them."""
    n_accepted = max(kept - 1, 0)
    lookup = min(draft.accepted_from(accepted.nodes, CONTEXT, DATASTORE), n_accepted)
    return StepRecord(n_accepted, draft.size - 1, draft.tree().depth, draft_s, verify_s,
                      lookup_accepted=lookup, lookup_size=draft.size_of(CONTEXT, DATASTORE),
                      datastore_accepted=min(draft.accepted_from(accepted.nodes, DATASTORE), lookup),
                      datastore_size=draft.size_of(DATASTORE))
