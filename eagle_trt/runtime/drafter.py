"""Drafting with the EAGLE-3 head: keep its KV cache in step with the target, and grow draft trees.

Positions: the target has committed tokens 0..n-1 and chose the root token at position n. The head's
cache holds draft positions 0..n-1, where draft position t read (feature of t, token t+1), so its last
output already predicts position n+1: the depth-1 children. A node at depth d (token position n+d) is
expanded by feeding (its parent's output hidden, its token) at draft position n+d-1, attending to the
prefix and to its own ancestors. Tree entries go to cache slots after n and are overwritten by the next
`extend`, so rejected branches cost nothing to undo. Tree growth itself is shared with the model drafter
(`runtime/tree_drafter.py`).
"""

from __future__ import annotations

import torch

from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.kernel_api import Part
from eagle_trt.runtime.tree_drafter import Candidates, Expansion, TreeDrafter

__all__ = ["Candidates", "Drafter"]


class Drafter(TreeDrafter):
    needs_features = True

    def __init__(self, head: Eagle3DraftHead, capacity: int, kv_dtype: torch.dtype | None = None,
                 k_scales=None, v_scales=None, max_positions: int | None = None):
        self.head = head
        self._cache_args = (kv_dtype, k_scales, v_scales, max_positions)
        self.cache = head.new_cache(capacity, kv_dtype, k_scales, v_scales)
        self.last_logits: torch.Tensor | None = None  # [Vd] draft logits for the root's children
        self.last_hidden: torch.Tensor | None = None  # [H] pre-norm output that produced them
        if max_positions is not None:  # the head shares the target's RoPE range
            self.max_positions = max_positions

    def fresh(self, capacity: int) -> "Drafter":
        """A drafter on the same head with its own KV cache of `capacity` slots (one per batched request)."""
        return Drafter(self.head, capacity, *self._cache_args)

    @property
    def length(self) -> int:
        return self.cache.length

    def reset(self) -> None:
        self.cache.length = 0

    def start(self, prompt_ids: torch.Tensor, aux: torch.Tensor, root: int) -> None:
        """After the target's prefill of prompt_ids [n] (features aux [n, n_aux*H]) chose `root`."""
        self.reset()
        # Draft position t reads (feature_t, token_{t+1}): shift the prompt by one and append the root.
        self.extend(aux, torch.cat([prompt_ids[1:], torch.tensor([root])]))

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

    # ---- hooks of the tree growth -------------------------------------------------------------------
    def _top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head.top_logp(logits, k)

    def _to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.draft_to_target[ids]

    def _expand(self, state: Expansion, hidden: torch.Tensor, tokens: torch.Tensor, depth: int,
                parent_vis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the head on F frontier nodes at `depth`. parent_vis: [F, W] slots each may see.

        Returns (draft logits [F, Vd], output hidden [F, H], the nodes' own visibility rows [F, W])."""
        part, positions, vis = self.expansion_rows(state, tokens, depth, parent_vis)
        logits, out = self.head.batched_forward(hidden, tokens, positions, [part])
        return logits, out, vis

    def expansion_rows(self, state: Expansion, tokens: torch.Tensor, depth: int,
                       parent_vis: torch.Tensor) -> tuple[Part, torch.Tensor, torch.Tensor]:
        """Where F frontier nodes at `depth` go in a head forward: their Part (this drafter's cache, the scratch
        slots they take, their mask), positions [F], and their own visibility rows [F, W]."""
        n, f = self.cache.length, tokens.numel()
        vis, mask, cur = state.place(parent_vis, n)
        positions = torch.full((f,), n + depth - 1, dtype=torch.long)
        return Part(self.cache, n + cur, f, mask), positions, vis

    # ---- tune's replay ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def replay_state(self, seq: list[int], aux: torch.Tensor) -> dict:
        """The head over a whole known sequence at once (target features aux [len(seq), F]), as `extend` would feed
        it piece by piece: draft position t reads (feature t, token t+1). `seek(state, n)` then sets any root n."""
        self.reset()
        t = len(seq) - 1
        mask = torch.ones(t, t, dtype=torch.bool).tril_()
        logits, hidden = self.head.forward(self.head.fuse(aux[:t]), torch.tensor(seq[1:]), torch.arange(t),
                                           self.cache, 0, mask)
        return {"logits": logits, "hidden": hidden}

    def seek(self, state: dict, n: int) -> None:
        """The drafter as it stands when the root is seq[n]: growing a tree from here overwrites cache slots >= n
        only, which smaller roots never read."""
        self.cache.length = n
        self.last_logits, self.last_hidden = state["logits"][n - 1], state["hidden"][n - 1]
