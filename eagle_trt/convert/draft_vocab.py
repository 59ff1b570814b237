"""Reduced draft vocabulary: the N target tokens the head is most likely to need.

    from eagle_trt.convert.draft_vocab import select_draft_vocab, d2t_from_vocab, load_d2t
    vocab = select_draft_vocab(counts, 8192)          # target ids, ascending
    d2t = d2t_from_vocab(vocab)                        # target_id = draft_id + d2t[draft_id]
    load_d2t(model, d2t)                               # into modelopt's eagle_module.d2t buffer

`counts` ranks tokens: the head is scored on predicting the target's greedy token, so the training
loop's cache pass counts the target's argmax predictions first and the data's own tokens second
(the tie-break), see `token_counts`. Draft ids are ordered by ascending target id, which is what
modelopt and the EAGLE-3 reference release use: d2t is then non-decreasing and >= 0.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import torch


def ranking(predicted_counts: torch.Tensor, seen_counts: torch.Tensor) -> torch.Tensor:
    """[V] int64 keys: how often the target predicted a token, ties broken by its count in the data."""
    seen = seen_counts.long()
    return predicted_counts.long() * (int(seen.max()) + 1 if seen.numel() else 1) + seen


def token_counts(vocab_size: int, predicted: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """`ranking` from raw token ids: the target's argmax predictions and the data's tokens."""
    pred = torch.bincount(predicted.flatten().long(), minlength=vocab_size)[:vocab_size]
    seen = torch.bincount(tokens.flatten().long(), minlength=vocab_size)[:vocab_size]
    return ranking(pred, seen)


def select_draft_vocab(counts: torch.Tensor, size: int, always: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
    """Target ids of the `size` highest counts (ties: lower id first), ascending.

    `always` (e.g. EOS ids) are forced in, replacing the least frequent picks."""
    vocab = counts.numel()
    if not 1 <= size <= vocab:
        raise ValueError(f"draft vocab size must be between 1 and {vocab}; got {size}")
    keys = counts.clone().long()
    forced = [t for t in dict.fromkeys(int(t) for t in always) if 0 <= t < vocab][:size]
    if forced:
        keys[torch.tensor(forced)] = torch.iinfo(torch.int64).max
    # Stable sort by descending key keeps lower ids first among equal counts.
    order = torch.sort(-keys, stable=True).indices
    return torch.sort(order[:size]).values


def d2t_from_vocab(vocab: torch.Tensor) -> torch.Tensor:
    """Ascending target ids [N] -> d2t [N] int64 with target_id = draft_id + d2t[draft_id]."""
    vocab = vocab.long()
    if vocab.numel() > 1 and not bool((vocab[1:] > vocab[:-1]).all()):
        raise ValueError("draft vocab must be strictly ascending target ids")
    return vocab - torch.arange(vocab.numel())


def draft_to_target(d2t: torch.Tensor) -> torch.Tensor:
    """d2t [N] -> the target id of every draft id."""
    return torch.arange(d2t.numel()) + d2t.long()


def target_to_draft(d2t: torch.Tensor, target_vocab_size: int) -> torch.Tensor:
    """[V] draft id of every target id, -1 where the token is not in the draft vocab."""
    t2d = torch.full((target_vocab_size,), -1, dtype=torch.long)
    t2d[draft_to_target(d2t)] = torch.arange(d2t.numel())
    return t2d


def load_d2t(model, d2t: torch.Tensor) -> None:
    """Copy d2t into a modelopt EAGLE model's `eagle_module.d2t` buffer (no-op at full vocab).

    Goes through modelopt's own loader (`load_draft_vocab_cache`), which checks shape and dtype."""
    cfg = model.eagle_config
    if cfg.draft_vocab_size >= cfg.vocab_size:
        return
    d2t = d2t.to(torch.int64).cpu()
    targets = draft_to_target(d2t)
    if int(targets.min()) < 0 or int(targets.max()) >= cfg.vocab_size:
        raise ValueError(f"d2t maps draft ids outside the target vocab ({cfg.vocab_size})")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d2t.pt"
        torch.save(d2t, path)
        with contextlib.redirect_stdout(sys.stderr):  # modelopt prints "Loaded draft vocab cache"
            type(model).load_draft_vocab_cache(model, str(path))
