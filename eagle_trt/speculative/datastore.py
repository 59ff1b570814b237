"""Retrieval drafts from a datastore of text the target wrote before (REST-style lookup).

Prompt lookup (speculative/lookup.py) copies from the current context only. A datastore adds a second
source: a large token corpus, typically the target's own answers to many prompts (the data the draft
head was trained on). When the last few committed tokens occur in it, the most frequent continuation
among those occurrences is a guess the target often agrees with: boilerplate, phrasing, code idioms.

The index is a sorted array of n-gram hashes per n (no Python objects per token), so a 200k-token store
loads in well under a second and a query is a binary search. Like every other draft it only proposes;
verification keeps just what the target itself would emit, so a hash collision or a stale datastore
costs verify rows, never correctness.

    >>> store = Datastore(torch.tensor([1, 2, 3, 4, -1, 1, 2, 3, 5, -1, 1, 2, 3, 4]), ngrams=(2,))
    >>> store.proposals([7, 2, 3], max_tokens=2, branches=2)  # (2, 3) was followed by 4 twice, by 5 once
    [[4], [5]]
"""

from __future__ import annotations

from collections import Counter

import torch

SEPARATOR = -1  # between documents: no n-gram or continuation crosses it
_BASE = 1_000_003  # hash multiplier (odd, > any vocabulary size)
NGRAMS = (4, 3, 2)  # suffix lengths searched, longest first


def _hashes(tokens: torch.Tensor, n: int) -> torch.Tensor:
    """Hash of every window tokens[i:i+n] ([N-n+1], int64 arithmetic wraps on overflow, which is fine)."""
    h = torch.zeros(tokens.numel() - n + 1, dtype=torch.int64)
    for j in range(n):
        h = h * _BASE + tokens[j: tokens.numel() - n + 1 + j]
    return h


class Datastore:
    """n-gram index over a token corpus; `proposals` returns the most frequent continuations of a suffix.

    `index`: the {n: (sorted keys, their end positions)} that `index_tensors` gave for the same tokens and n-grams
    (an engine stores it, so opening one sorts nothing); None builds it here."""

    def __init__(self, tokens: torch.Tensor, ngrams: tuple[int, ...] = NGRAMS, max_hits: int = 128,
                 index: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None):
        self.tokens = tokens.to(torch.int64).flatten()
        self._np = self.tokens.numpy()  # continuations are read a few rows a step: numpy slices, no per-token objects
        self.ngrams = tuple(sorted(set(ngrams), reverse=True))
        if not self.ngrams or min(self.ngrams) < 1:
            raise ValueError(f"ngrams must be positive lengths, got {ngrams}")
        self.max_hits = max_hits
        self._index = dict(index) if index is not None else self._build_index()

    def _build_index(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        out = {}
        sep = (self.tokens == SEPARATOR).to(torch.int64)
        csep = torch.cat([torch.zeros(1, dtype=torch.int64), sep.cumsum(0)])
        total = self.tokens.numel()
        for n in self.ngrams:
            if total <= n:
                continue
            starts = torch.arange(total - n)  # windows that have at least one following token
            # Valid: no separator inside the window nor as the next token.
            ok = (csep[starts + n + 1] - csep[starts]) == 0
            keys = _hashes(self.tokens, n)[: total - n][ok]
            ends = (starts + n - 1)[ok]
            order = torch.argsort(keys, stable=True)  # equal keys keep position order: oldest first
            out[n] = (keys[order], ends[order])
        return out

    def index_tensors(self) -> dict[str, torch.Tensor]:
        """The index as named tensors (keys.N, ends.N per n-gram length), what `from_tensors` reads back."""
        out = {}
        for n, (keys, ends) in self._index.items():
            out[f"keys.{n}"], out[f"ends.{n}"] = keys, ends
        return out

    @classmethod
    def from_tensors(cls, tokens: torch.Tensor, tensors: dict[str, torch.Tensor], ngrams: tuple[int, ...]
                     ) -> "Datastore":
        """A datastore over `tokens` with the stored index `index_tensors` made for these n-grams."""
        index = {n: (tensors[f"keys.{n}"].to(torch.int64), tensors[f"ends.{n}"].to(torch.int64))
                 for n in ngrams if f"keys.{n}" in tensors}
        return cls(tokens, ngrams, index=index)

    def __len__(self) -> int:
        return int((self.tokens != SEPARATOR).sum())

    def _hits(self, tail: list[int]) -> torch.Tensor:
        """End positions of the longest indexed suffix of `tail` that occurs (latest max_hits), or empty."""
        for n in self.ngrams:
            if len(tail) < n or n not in self._index:
                continue
            keys, ends = self._index[n]
            key = _hashes(torch.tensor(tail[-n:], dtype=torch.int64), n)
            lo = int(torch.searchsorted(keys, key, right=False))
            hi = int(torch.searchsorted(keys, key, right=True))
            if hi > lo:
                return ends[max(lo, hi - self.max_hits): hi]
        return torch.empty(0, dtype=torch.int64)

    def proposals(self, tail: list[int], max_tokens: int, branches: int) -> list[list[int]]:
        """Up to `branches` continuations of `tail` with distinct first tokens, most frequent first; each
        follows, token by token, the most common choice among the occurrences that agree with it so far
        (ties go to the latest occurrence). A chain stops where most of those occurrences end."""
        if max_tokens <= 0 or branches <= 0:
            return []
        rows = []
        for end in reversed(self._hits(tail).tolist()):  # latest first, so ties go to the latest
            row = self._np[end + 1: end + 1 + max_tokens].tolist()
            rows.append(row[: row.index(SEPARATOR)] if SEPARATOR in row else row)
        out: list[list[int]] = []
        for first, _ in Counter(r[0] for r in rows if r).most_common(branches):
            group, chain = [r for r in rows if r and r[0] == first], [first]
            for j in range(1, max_tokens):
                best, _ = Counter(r[j] if len(r) > j else SEPARATOR for r in group).most_common(1)[0]
                if best == SEPARATOR:
                    break
                chain.append(best)
                group = [r for r in group if len(r) > j and r[j] == best]
            out.append(chain)
        return out
