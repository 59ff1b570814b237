"""Drafting with the EAGLE-3 head: keep its KV cache in step with the target, and grow draft trees.

Positions: the target has committed tokens 0..n-1 and chose the root token at position n. The head's
cache holds draft positions 0..n-1, where draft position t read (feature of t, token t+1), so its last
output already predicts position n+1: the depth-1 children. A node at depth d (token position n+d) is
expanded by feeding (its parent's output hidden, its token) at draft position n+d-1, attending to the
prefix and to its own ancestors. Tree entries go to cache slots after n and are overwritten by the next
`extend`, so rejected branches cost nothing to undo.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.speculative.tree import StaticLayout, Tree, select_top_nodes, tree_from_parents


class Drafter:
    def __init__(self, head: Eagle3DraftHead, capacity: int, kv_dtype: torch.dtype | None = None,
                 k_scales=None, v_scales=None):
        self.head = head
        self.cache = head.new_cache(capacity, kv_dtype, k_scales, v_scales)
        self.last_logits: torch.Tensor | None = None  # [Vd] draft logits for the root's children
        self.last_hidden: torch.Tensor | None = None  # [H] pre-norm output that produced them

    @property
    def length(self) -> int:
        return self.cache.length

    def reset(self) -> None:
        self.cache.length = 0

    def extend(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Feed verified features aux [T, n_aux*H] with the tokens that follow them [T]."""
        n, t = self.cache.length, next_tokens.numel()
        mask = None
        if t > 1:
            mask = torch.cat([torch.ones(t, n, dtype=torch.bool), torch.ones(t, t, dtype=torch.bool).tril_()], 1)
        positions = torch.arange(n, n + t)
        logits, hidden = self.head.forward(self.head.fuse(aux), next_tokens, positions, self.cache, n, mask,
                                           last_only=True)
        self.cache.length = n + t
        self.last_logits, self.last_hidden = logits[-1], hidden[-1]

    # ---- tree expansion ------------------------------------------------------------------------
    def _expand(self, state: "_Expansion", hidden: torch.Tensor, tokens: torch.Tensor, depth: int,
                parent_vis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the head on F frontier nodes at `depth`. parent_vis: [F, W] slots each may see.

        Returns (draft logits [F, Vd], output hidden [F, H], the nodes' own visibility rows [F, W])."""
        n, f = self.cache.length, tokens.numel()
        cur = state.used
        vis = parent_vis.clone()
        vis[torch.arange(f), torch.arange(cur, cur + f)] = True
        mask = torch.cat([torch.ones(f, n, dtype=torch.bool), vis[:, : cur + f]], dim=1)
        positions = torch.full((f,), n + depth - 1, dtype=torch.long)
        logits, out = self.head.forward(hidden, tokens, positions, self.cache, n + cur, mask)
        state.used += f
        return logits, out, vis

    def draft_dynamic(self, root: int, beam_width: int, depth: int, total_tokens: int,
                      confidence_threshold: float = 0.0) -> Tree:
        """EAGLE-2 dynamic tree: expand the best `beam_width` nodes per level, keep the best `total_tokens`."""
        min_score = float(torch.log(torch.tensor(confidence_threshold))) if confidence_threshold > 0 else None
        cand = self.grow_candidates(beam_width, depth, min_score)
        kept, tree_par = select_top_nodes(cand.scores, cand.parents, cand.depths, total_tokens, min_score)
        node_tokens = torch.cat([torch.tensor([root]), cand.tokens[kept]])
        return tree_from_parents(node_tokens, torch.cat([torch.tensor([-1]), tree_par]))

    def grow_candidates(self, beam_width: int, depth: int, min_score: float | None = None) -> "Candidates":
        """Every candidate the beam expansion scores, in creation order (parents before children).

        The bookkeeping is on Python lists: a tree has tens of candidates, fewer than the torch calls it would take.
        Scores are cumulative log-probs (the head's top-k per node, `Eagle3DraftHead.top_logp`)."""
        k = beam_width
        d2t = self.head.draft_to_target
        state = _Expansion(width=k * max(depth - 1, 1))
        s, i = self.head.top_logp(self.last_logits, k)
        scores: list[float] = s[0].tolist()
        parents, depths = [-1] * len(scores), [1] * len(scores)
        ids = [i[0]]  # draft ids, one tensor per level
        frontier = list(range(len(scores)))
        f_tokens = d2t[i[0]]
        f_hidden = self.last_hidden.expand(len(frontier), -1)
        f_vis = torch.zeros(len(frontier), state.width, dtype=torch.bool)
        for d in range(1, depth):
            if min_score is not None:  # stop growing branches the head is unsure of
                ok = [j for j, f in enumerate(frontier) if scores[f] >= min_score]
                if not ok:
                    break
                if len(ok) < len(frontier):
                    sel = torch.tensor(ok)
                    frontier = [frontier[j] for j in ok]
                    f_tokens, f_hidden, f_vis = f_tokens[sel], f_hidden[sel], f_vis[sel]
            logits, out, vis = self._expand(state, f_hidden, f_tokens, d, f_vis)
            s, i = self.head.top_logp(logits, k)  # [F, k]
            width = s.shape[1]
            base = len(scores)
            child = [scores[f] + v for f, row in zip(frontier, s.tolist()) for v in row]
            scores += child
            parents += [f for f in frontier for _ in range(width)]
            depths += [d + 1] * len(child)
            flat = i.flatten()
            ids.append(flat)
            # Next frontier: the best k children of this level (global beam over the level; ties to the earlier).
            best = sorted(range(len(child)), key=lambda j: -child[j])[:k]
            pick = torch.tensor(best)
            rows = torch.tensor([j // width for j in best])
            frontier = [base + j for j in best]
            f_tokens, f_hidden, f_vis = d2t[flat[pick]], out[rows], vis[rows]
        return Candidates(torch.tensor(scores), torch.tensor(parents), torch.tensor(depths), d2t[torch.cat(ids)])

    def draft_static(self, root: int, layout: StaticLayout) -> Tree:
        """Fill a fixed tree: node i is the ranks[i]-th best draft token after its parent."""
        d2t = self.head.draft_to_target
        n_nodes = layout.parents.numel()
        tokens = torch.zeros(n_nodes, dtype=torch.long)
        tokens[0] = root
        has_child = torch.zeros(n_nodes, dtype=torch.bool)
        has_child[layout.parents[1:]] = True
        state = _Expansion(width=int(has_child.sum()) + 1)
        hidden = torch.zeros(n_nodes, self.last_hidden.shape[-1], dtype=self.last_hidden.dtype)
        vis = torch.zeros(n_nodes, state.width, dtype=torch.bool)
        logp_of = {0: torch.log_softmax(self.last_logits.float(), dim=-1)}
        max_depth = int(layout.depths.max()) if n_nodes > 1 else 0
        for d in range(1, max_depth + 1):
            level = (layout.depths == d).nonzero().flatten()
            # Tokens of this level from their parents' distributions.
            for node in level.tolist():
                p = int(layout.parents[node])
                if p not in logp_of:
                    continue
                tokens[node] = d2t[logp_of[p].topk(int(layout.ranks[node]) + 1).indices[-1]]
            expand = level[has_child[level]]
            if d == max_depth or expand.numel() == 0:
                continue
            par = layout.parents[expand]
            in_hidden = torch.where((par == 0)[:, None], self.last_hidden, hidden[par])
            logits, out, v = self._expand(state, in_hidden, tokens[expand], d, vis[par])
            logp = torch.log_softmax(logits.float(), dim=-1)
            hidden[expand], vis[expand] = out, v
            for j, node in enumerate(expand.tolist()):
                logp_of[node] = logp[j]
        return tree_from_parents(tokens, layout.parents)


@dataclass
class Candidates:
    """Draft candidates of one dynamic tree: cumulative log-prob, parent (-1 = root), depth, target token id."""

    scores: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    tokens: torch.Tensor


class _Expansion:
    """Bookkeeping for one tree: how many scratch cache slots after the prefix are in use."""

    def __init__(self, width: int):
        self.width = width
        self.used = 0
