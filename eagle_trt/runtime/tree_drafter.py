"""Growing draft trees, whatever proposes the tokens: EAGLE-2 dynamic trees (beam expansion + global rerank),
static trees and chains, on two hooks each drafter implements.

    drafter.start(prompt_ids, aux, root)          # after the target's prefill
    tree = drafter.draft_dynamic(root, beam_width=4, depth=5, total_tokens=16)
    ...verify...
    drafter.extend(aux_of_path, accepted + [bonus])

The drafters: `runtime/drafter.py` (the EAGLE-3 head, which reads the target's features) and
`runtime/model_drafter.py` (a small LM with its own KV cache, which reads tokens only). What the runner relies on:

    needs_features     the drafter reads the target's aux features: the target computes them only when it does
    start / extend     keep the drafter's state in step with the committed tokens; afterwards `last_logits`
                       scores the root's children and `last_hidden` is what expanding them carries ([H] for the
                       head, an empty tensor for a model: its KV cache is all the state it has)
    max_positions      the highest position + 1 its RoPE tables hold
    replay_state/seek  tune's replay: the drafter over a whole known sequence once, then set to any root of it

Hooks: `_top_logp(logits [R, V], k)` -> (log-probs [R, k], draft ids [R, k]); `_to_target(ids)` maps draft ids to
target ids; `_expand(state, carry [F, *], tokens [F], depth, parent_vis [F, W])` runs F frontier nodes at `depth`,
each seeing the prefix, its ancestors among the tree's scratch slots and itself, and returns (logits [F, V], the
carry their children need [F, *], the nodes' own visibility rows [F, W]). Scratch slots sit after the committed
prefix and the next `extend` overwrites them, so rejected branches cost nothing to undo.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_trt.speculative.tree import StaticLayout, Tree, select_top_nodes, tree_from_parents


@dataclass
class Candidates:
    """Draft candidates of one dynamic tree: cumulative log-prob, parent (-1 = root), depth, target token id."""

    scores: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    tokens: torch.Tensor


class Expansion:
    """Bookkeeping for one tree: how many scratch cache slots after the prefix are in use."""

    def __init__(self, width: int):
        self.width = width
        self.used = 0

    def place(self, parent_vis: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Scratch slots for F frontier nodes whose parents see `parent_vis` [F, W]: each node sees the `prefix`
        committed slots, its ancestors' scratch slots and its own. Returns (the nodes' visibility rows [F, W], their
        attention mask [F, prefix + used + F], the first slot they take, counted after the prefix)."""
        f, cur = parent_vis.shape[0], self.used
        vis = parent_vis.clone()
        vis[torch.arange(f), torch.arange(cur, cur + f)] = True
        mask = torch.cat([torch.ones(f, prefix, dtype=torch.bool), vis[:, : cur + f]], dim=1)
        self.used += f
        return vis, mask, cur


def min_score_of(confidence_threshold: float) -> float | None:
    """The cumulative log-prob below which a branch stops growing (None: no threshold)."""
    return float(torch.log(torch.tensor(confidence_threshold))) if confidence_threshold > 0 else None


class TreeDrafter:
    needs_features = True
    samples_chains = False  # has `draft_sampled_chain` (draft tokens drawn from its own q at T > 0)
    max_positions = 1 << 62
    last_logits: torch.Tensor | None = None
    last_hidden: torch.Tensor | None = None

    # ---- hooks --------------------------------------------------------------------------------------
    def _top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _to_target(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _expand(self, state: Expansion, carry: torch.Tensor, tokens: torch.Tensor, depth: int,
                parent_vis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    # ---- trees ----------------------------------------------------------------------------------------
    def draft_dynamic(self, root: int, beam_width: int, depth: int, total_tokens: int,
                      confidence_threshold: float = 0.0) -> Tree:
        """EAGLE-2 dynamic tree: expand the best `beam_width` nodes per level, keep the best `total_tokens`."""
        min_score = min_score_of(confidence_threshold)
        return self.tree_of(root, self.grow_candidates(beam_width, depth, min_score), total_tokens, min_score)

    def tree_of(self, root: int, cand: Candidates, total_tokens: int, min_score: float | None) -> Tree:
        """The best `total_tokens` candidates as a tree below the root, each node's cumulative log-prob kept."""
        kept, tree_par = select_top_nodes(cand.scores, cand.parents, cand.depths, total_tokens, min_score)
        node_tokens = torch.cat([torch.tensor([root]), cand.tokens[kept]])
        tree = tree_from_parents(node_tokens, torch.cat([torch.tensor([-1]), tree_par]))
        # Each node's cumulative draft log-prob (the root's 0): what a batched step sizes trees by.
        tree.scores = [0.0] + [float(cand.scores[j]) for j in kept.tolist()]
        return tree

    def grow_candidates(self, beam_width: int, depth: int, min_score: float | None = None) -> Candidates:
        """Every candidate the beam expansion scores, in creation order (parents before children)."""
        growth = self.growth(beam_width, depth, min_score)
        try:
            ask = next(growth)
            while True:
                ask = growth.send(self._expand(*ask))
        except StopIteration as done:
            return done.value

    def growth(self, beam_width: int, depth: int, min_score: float | None = None):
        """The beam expansion as a generator: it yields each level's expansion (the `_expand` arguments), is sent
        the result, and returns the Candidates. So several drafters' trees can grow in lockstep, each level of all of
        them in one forward (`runtime/batch_drafting.py`).

        The bookkeeping is on Python lists: a tree has tens of candidates, fewer than the torch calls it would take.
        Scores are cumulative log-probs of the drafter's top-k per node."""
        k = beam_width
        state = Expansion(width=k * max(depth - 1, 1))
        s, i = self._top_logp(self.last_logits, k)
        scores: list[float] = s[0].tolist()
        parents, depths = [-1] * len(scores), [1] * len(scores)
        ids = [i[0]]  # draft ids, one tensor per level
        frontier = list(range(len(scores)))
        f_tokens = self._to_target(i[0])
        f_carry = self.last_hidden.expand(len(frontier), -1)
        f_vis = torch.zeros(len(frontier), state.width, dtype=torch.bool)
        for d in range(1, depth):
            if min_score is not None:  # stop growing branches the drafter is unsure of
                ok = [j for j, f in enumerate(frontier) if scores[f] >= min_score]
                if not ok:
                    break
                if len(ok) < len(frontier):
                    sel = torch.tensor(ok)
                    frontier = [frontier[j] for j in ok]
                    f_tokens, f_carry, f_vis = f_tokens[sel], f_carry[sel], f_vis[sel]
            logits, out, vis = yield state, f_carry, f_tokens, d, f_vis
            s, i = self._top_logp(logits, k)  # [F, k]
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
            f_tokens, f_carry, f_vis = self._to_target(flat[pick]), out[rows], vis[rows]
        return Candidates(torch.tensor(scores), torch.tensor(parents), torch.tensor(depths),
                          self._to_target(torch.cat(ids)))

    def draft_static(self, root: int, layout: StaticLayout) -> Tree:
        """Fill a fixed tree: node i is the ranks[i]-th best draft token after its parent."""
        n_nodes = layout.parents.numel()
        tokens = torch.zeros(n_nodes, dtype=torch.long)
        tokens[0] = root
        has_child = torch.zeros(n_nodes, dtype=torch.bool)
        has_child[layout.parents[1:]] = True
        state = Expansion(width=int(has_child.sum()) + 1)
        carry = torch.zeros(n_nodes, *self.last_hidden.shape[-1:], dtype=self.last_hidden.dtype)
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
                tokens[node] = self._to_target(logp_of[p].topk(int(layout.ranks[node]) + 1).indices[-1])
            expand = level[has_child[level]]
            if d == max_depth or expand.numel() == 0:
                continue
            par = layout.parents[expand]
            in_carry = torch.where((par == 0)[:, None], self.last_hidden, carry[par])
            logits, out, v = self._expand(state, in_carry, tokens[expand], d, vis[par])
            logp = torch.log_softmax(logits.float(), dim=-1)
            carry[expand], vis[expand] = out, v
            for j, node in enumerate(expand.tolist()):
                logp_of[node] = logp[j]
        return tree_from_parents(tokens, layout.parents)
