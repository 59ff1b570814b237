"""One optimizer step's data-parallel half: the head wrapped in torch's DistributedDataParallel, and modelopt's loss
weighted so that N ranks step exactly as one process does on the same global batch.

    ddp = wrap_ddp(model, world, device)                  # the model itself in a world of one
    share = StepShare.of(global_batch, cache.length, world, cfg.ttt_steps)
    with share.weighting(model):
        out = ddp(...)                                    # out.loss: this rank's weighted part
    loss, acc, stops = share.reduce(out.loss, out.train_acc[0], [...])   # the global batch's figures

Why the weights: modelopt's EAGLE-3 loss divides each TTT step's summed soft cross-entropy by the number of loss
tokens in the batch it was given (HFEagleModel._eagle_loss in modelopt/torch/speculative/plugins/hf_eagle.py), and DDP
averages the ranks' gradients. The mean of per-rank token means is the global token mean only when every rank holds
as many tokens as the others. Each TTT step k's term on rank r is therefore scaled by size * T_k,r / T_k (T_k: the
global batch's loss tokens at step k, computed from the cache's lengths, so no collective is needed); DDP's mean
then is the gradient of the loss over the whole global batch, whatever the split.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from .distributed import World, rank_share


def wrap_ddp(model, world: World, device: torch.device):
    """DDP over the head's trainable parameters; the frozen target is ignored (identical on every rank: all of them
    loaded it from the same files), so nothing of it is broadcast or reduced. The model itself in a world of one."""
    if not world.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    frozen += [n for n, _ in model.named_buffers()]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, frozen)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def ttt_token_counts(lengths: list[int], ttt_steps: int) -> list[int]:
    """Loss tokens per TTT step: step k scores positions 1+k .. n-1 of a sequence of n tokens (modelopt's shift)."""
    return [sum(max(0, n - 1 - k) for n in lengths) for k in range(ttt_steps)]


@dataclass
class StepShare:
    indices: list[int]  # the sequences this rank runs (a stand-in when its share is empty; weight 0 then)
    local: list[int]  # this rank's loss tokens per TTT step (0 for a stand-in)
    total: list[int]  # the global batch's
    world: World

    @classmethod
    def of(cls, global_batch: list[int], length: Callable[[int], int], world: World, ttt_steps: int) -> "StepShare":
        mine = rank_share(global_batch, world.rank, world.size)
        total = ttt_token_counts([length(i) for i in global_batch], ttt_steps)
        if not mine:  # fewer sequences than ranks: run one with zero weight, since every rank must reduce
            return cls(global_batch[:1], [0] * ttt_steps, total, world)
        return cls(mine, ttt_token_counts([length(i) for i in mine], ttt_steps), total, world)

    def weight(self, k: int) -> float:
        if k >= len(self.total) or not self.total[k]:
            return 0.0
        return self.world.size * self.local[k] / self.total[k]

    @contextlib.contextmanager
    def weighting(self, model):
        """modelopt's per-TTT-step loss scaled by `weight(k)` for the forwards inside the block (none in a world of
        one: its loss is modelopt's own)."""
        if not self.world.active:
            yield
            return
        original = model._eagle_loss  # the bound method; an instance attribute shadows it until the block ends
        calls = [0]

        def weighted(*args, **kwargs):
            loss, acc = original(*args, **kwargs)
            k = calls[0]
            calls[0] += 1
            return loss * self.weight(k), acc

        model._eagle_loss = weighted
        try:
            yield
        finally:
            del model._eagle_loss

    def reduce(self, loss: float, acc: list[float], flags: list[int]) -> tuple[float, list[float], list[int]]:
        """The global batch's loss and per-TTT-step top-1 accuracy (token-weighted over the ranks), and each flag
        summed over the ranks; one collective."""
        if not self.world.active:
            return loss, list(acc), list(flags)
        size = self.world.size
        shares = [a * (self.local[k] / self.total[k] if self.total[k] else 0.0) for k, a in enumerate(acc)]
        out = self.world.sum([loss / size, *shares, *flags])
        return out[0], out[1:1 + len(acc)], [int(round(f)) for f in out[1 + len(acc):]]


__all__ = ["wrap_ddp", "ttt_token_counts", "StepShare"]
