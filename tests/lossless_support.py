"""The lossless assertion, conditioned on what the kernels guarantee.

    assert_lossless(runner, prompt, speculative_ids, ar_ids)

Where the target's backend is row-invariant (`LlamaTarget.row_invariant`: every compiled kernel, fp32 and bf16),
speculative output must equal plain decoding token for token, and nothing else passes. Where it is not (the torch
reference in fp32: one-row and many-row GEMMs differ in the last bit), the two may part only at a near-tie: the
helper recomputes the target's logits where they first differ and requires the top two to be within rounding of
each other; a difference anywhere else fails as it would on the kernels. So the tests pass by the guarantee the
docs state, not by luck.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from eagle_trt.speculative.tree import tree_from_parents

NEAR_TIE = 1e-4  # relative gap between the top two logits that rounding in the last bits can flip


def target_of(model):
    """A LlamaTarget from a target, a Runner, a Session or an engine dir."""
    if isinstance(model, (str, Path)):
        from eagle_trt.runtime.session import Session

        model = Session.open(model, verify=False)
    model = getattr(model, "runner", model)
    return getattr(model, "target", model)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top_two_gap(target, ids: list[int]) -> tuple[float, float]:
    """(top1 - top2, |top1|) of the target's next-token logits after `ids`, from one fresh prefill."""
    cache = target.new_cache(len(ids) + 1)
    with torch.no_grad():
        logits, _ = target.forward(torch.tensor(ids), torch.arange(len(ids)), cache)
    top = logits[-1].float().topk(2).values
    return float(top[0] - top[1]), float(top[0].abs())


def assert_lossless(model, prompt: list[int], got: list[int], want: list[int], what: str = "") -> None:
    k = first_difference(got, want)
    if k is None:
        return
    target = target_of(model)
    where = f"{what}: " if what else ""
    assert not target.row_invariant, (
        f"{where}speculative output differs from plain decoding at token {k} on row-invariant kernels "
        f"({target.kernels.name}): {got[k:k + 4]} != {want[k:k + 4]}")
    assert k < len(got) and k < len(want), f"{where}lengths differ ({len(got)} vs {len(want)}): not a near-tie"
    gap, scale = top_two_gap(target, list(prompt) + list(want[:k]))
    assert gap <= NEAR_TIE * max(1.0, scale), (
        f"{where}speculative output differs from plain decoding at token {k}, where the top two logits are "
        f"{gap:.3g} apart: not a near-tie that rounding could flip ({target.kernels.name} is not row-invariant)")


class OracleDrafter:
    """Wraps the real drafter; plants the reference continuation in each tree."""

    def __init__(self, inner, prompt_len, reference, seed):
        self.inner, self.p, self.ref, self.rng = inner, prompt_len, reference, random.Random(seed)
        self.extend, self.reset, self.start = inner.extend, inner.reset, inner.start

    def __getattr__(self, name):  # needs_features, max_positions, ...: the real drafter's
        return getattr(self.inner, name)

    def _tree(self, root):
        g = self.inner.length - self.p  # index of the root in the reference continuation
        truth = self.ref[g + 1 : g + 1 + self.rng.randint(0, 6)]
        if truth and self.rng.random() < 0.3:  # a wrong token mid-path: acceptance must stop there
            truth = list(truth)
            truth[self.rng.randrange(len(truth))] = (truth[0] + 1) % 250
        tokens, parents = [root], [-1]
        prev = 0
        for tok in truth:
            for _ in range(self.rng.randint(0, 2)):  # wrong siblings before the right one
                tokens.append((tok + 1 + self.rng.randrange(200)) % 250)
                parents.append(prev)
            tokens.append(tok)
            parents.append(prev)
            prev = len(tokens) - 1
        return tree_from_parents(torch.tensor(tokens), torch.tensor(parents))

    def draft_dynamic(self, root, *a, **k):
        self.inner.draft_dynamic(root, *a, **k)  # keep the real head's work in the loop
        return self._tree(root)

    def draft_static(self, root, layout):
        return self._tree(root)
