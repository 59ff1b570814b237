"""Drafting with a small language model that shares the target's tokenizer (the classic draft/target method).

    draft = DraftModel.load("engines/x/draft", torch.float32)
    drafter = ModelDrafter(draft, capacity=4096, target_vocab=target.spec.vocab_size)
    runner = Runner(target, None, capacity=4096, drafter=drafter)

The draft model is the target's own forward (`LlamaTarget`, so Llama, Qwen2, Mistral) run with its own weights and
KV cache. It reads tokens only: the target computes no features for it.

Positions: the target has committed tokens 0..n-1 and chose the root at position n. The draft's cache holds tokens
0..n, the root included, and `last_logits` (its output at the root) scores the depth-1 children. A frontier node at
depth d sits at position n + d; expanding it runs its token through the draft model in a scratch slot after the
prefix, seeing the prefix, its own ancestors and itself (`DraftModel` takes that visibility as a full mask). After a
verify step `extend` runs the accepted tokens and the bonus at positions n+1.., over the scratch slots: the cache
again holds exactly the committed tokens and the new root.

Vocabularies: the two models share a tokenizer (convert checks it), but their embedding tables may be padded to
different sizes. Draft tokens come from the first min(V_draft, V_target) ids only, and at T > 0 the draft's q is
padded with zeros to the target's vocabulary.
"""

from __future__ import annotations

import torch

from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.tree_drafter import Expansion, TreeDrafter
from eagle_trt.speculative.sampling import SamplingParams, processed_probs, sample
from eagle_trt.speculative.tree import Tree, tree_from_parents


class DraftModel(LlamaTarget):
    """A small LM run as a drafter: `LlamaTarget`, whose tree mask may also name the cached slots a row sees.

    A tree mask of width start + T ([T, start + T], True = visible) is used as given, so frontier nodes in scratch
    slots see the committed prefix and their own ancestors only; a [T, T] mask (or None) means what it means for
    the target (the whole prefix visible)."""

    @staticmethod
    def _mask(t: int, start: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        if tree_mask is not None and tree_mask.shape[-1] == start + t and start > 0:
            return tree_mask
        return LlamaTarget._mask(t, start, tree_mask)


class ModelDrafter(TreeDrafter):
    needs_features = False
    samples_chains = True

    def __init__(self, model: DraftModel, capacity: int, target_vocab: int, kv_dtype: torch.dtype | None = None):
        self.model = model
        self.kv_dtype = kv_dtype
        self.cache = model.new_cache(capacity, kv_dtype)
        self.vocab = min(model.spec.vocab_size, target_vocab)  # ids the draft may propose
        self.target_vocab = target_vocab
        self.max_positions = model.spec.max_position_embeddings
        self.last_logits: torch.Tensor | None = None  # [vocab] draft logits after the root
        self.last_hidden = torch.empty(0, dtype=model.dtype)  # no carry: the KV cache is the draft's state

    def fresh(self, capacity: int) -> "ModelDrafter":
        """A drafter on the same model with its own KV cache of `capacity` slots (one per batched request)."""
        return ModelDrafter(self.model, capacity, self.target_vocab, self.kv_dtype)

    @property
    def length(self) -> int:
        return self.cache.length

    def reset(self) -> None:
        self.cache.length = 0

    def start(self, prompt_ids: torch.Tensor, aux: torch.Tensor | None, root: int) -> None:
        """After the target's prefill of prompt_ids [n] chose `root`: the draft's own prefill of prompt + root."""
        self.reset()
        self.extend(None, torch.cat([prompt_ids, torch.tensor([root])]))

    def extend(self, aux: torch.Tensor | None, next_tokens: torch.Tensor) -> None:
        """Commit tokens [T] (a step's accepted tokens and its bonus) at the next positions; `aux` is not read."""
        n, t = self.cache.length, next_tokens.numel()
        # A target id past the draft's embedding table (vocabulary padding) reads row 0: it only shapes a proposal.
        tokens = torch.where(next_tokens < self.model.spec.vocab_size, next_tokens, 0)
        hidden, _ = self.model.hidden_states(tokens, torch.arange(n, n + t), self.cache, rows=torch.tensor([t - 1]))
        self.cache.length = n + t
        self.last_logits = self._logits(hidden)[0]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)[..., : self.vocab]

    # ---- hooks of the tree growth -------------------------------------------------------------------
    def _top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.view(-1, logits.shape[-1])
        return torch.log_softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)

    def _to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def _expand(self, state: Expansion, carry: torch.Tensor, tokens: torch.Tensor, depth: int,
                parent_vis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run F frontier nodes at `depth` (positions n - 1 + depth, n = the cache length with the root) in scratch
        slots n + used..; parent_vis [F, W]: the scratch slots each may see. Returns (logits [F, vocab], carry
        unchanged, the nodes' own visibility rows [F, W])."""
        n, f = self.cache.length, tokens.numel()
        vis, mask, cur = state.place(parent_vis, n)  # mask [F, n + cur + F]
        positions = torch.full((f,), n - 1 + depth, dtype=torch.long)
        self.cache.length = n + cur  # where the forward writes its K/V
        try:
            hidden, _ = self.model.hidden_states(tokens, positions, self.cache, mask)
        finally:
            self.cache.length = n
        return self._logits(hidden), carry, vis

    # ---- sampling: a chain drawn from the draft's own q ---------------------------------------------------
    def draft_sampled_chain(self, root: int, depth: int, params: SamplingParams,
                            generator: torch.Generator | None) -> tuple[Tree, dict[int, torch.Tensor]]:
        """A chain of `depth` tokens, each drawn from the draft's processed distribution q (the target's temperature,
        top-k and top-p applied to the draft's logits) given the tokens before it. Returns the tree and, per node,
        the q [V_target] its token was drawn from, for verification by min(1, p/q) (speculative/verify.py)."""
        state = Expansion(width=max(depth - 1, 1))
        vis = torch.zeros(1, state.width, dtype=torch.bool)
        logits, tokens, proposals = self.last_logits, [root], {}
        for d in range(1, depth + 1):
            q = torch.zeros(self.target_vocab)
            q[: self.vocab] = processed_probs(logits, params)
            tokens.append(sample(q, generator))
            proposals[d] = q
            if d < depth:
                out, _, vis = self._expand(state, self.last_hidden.expand(1, -1), torch.tensor(tokens[-1:]), d, vis)
                logits = out[0]
        return tree_from_parents(torch.tensor(tokens), list(range(-1, depth))), proposals

    # ---- tune's replay ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def replay_state(self, seq: list[int], aux: torch.Tensor | None = None) -> dict:
        """The draft model over a whole known sequence once (its final hidden state at every position); `seek(state,
        n)` then sets the drafter to root n."""
        self.reset()
        tokens = torch.tensor(seq)
        hidden, _ = self.model.hidden_states(torch.where(tokens < self.model.spec.vocab_size, tokens, 0),
                                             torch.arange(len(seq)), self.cache)
        return {"hidden": hidden}

    def seek(self, state: dict, n: int) -> None:
        """The drafter as it stands when the root is seq[n] (tokens 0..n cached): growing a tree from here overwrites
        cache slots > n only, which smaller roots never read."""
        self.cache.length = n + 1
        self.last_logits = self._logits(state["hidden"][n:n + 1])[0]

