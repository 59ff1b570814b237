"""Adaptive prompt lookup: offer a copied continuation only as far as it pays for its verify rows.

A copy (speculative/lookup.py) costs verify rows whether or not the target accepts it, and earns the tokens it gets
accepted beyond the head's own path. Whether that pays depends on the text (code repeats itself, chat rarely) and on
the machine (a verify row is nearly free where the projections are memory-bound, and costs a sixth of a decode where
they are compute-bound). Both sides are learned while the runner works:

- **yield**, per request: for each source (context, datastore), branch rank and position j of a chain that lies
  past the head's tree (where the chain adds a verify row), how often the chain's j-th token is an *extra* accepted
  token: it matches the emitted text and the head's path stopped before j. Greedy decoding emits the target's own
  text whatever was verified, so this is exact whether the chain was grafted or cut: every proposed chain is scored
  once the emitted text covers it. A Beta(1, 4) prior starts each estimate.
- **price**, per runner: a verify row costs `row_ms`, the least-squares slope of the verify steps' times in their
  row counts (once those counts spread: copies pass whole until then, which spreads them); a token is worth
  `step_ms / tokens_per_step` (this request's running means).

Positions a chain shares with the head's tree cost nothing and are kept; past them, a chain is cut before its
first position whose estimated yield times a token's worth is below a row's cost. Until both prices are known,
chains pass whole: the configured behaviour.
Lossless either way: this only chooses which guesses the target checks. Greedy only: the runtime leaves sampling's
copies as configured, so a seeded sampled run does not depend on timings.

    >>> gate = CopyGate()
    >>> gate.prices(row_ms=1.0, token_ms=2.0)
    >>> gate.cut([[5, 6, 7, 8]], source=0, start=10)      # prior yield 0.2 x 2 ms < 1 ms a row: cut to nothing
    [[]]
    >>> gate.cut([[5, 6, 7, 8]], source=0, start=10, shared=[2])   # the tree holds 5 -> 6: those two are free
    [[5, 6]]
    >>> gate.prices(row_ms=0.1, token_ms=2.0)
    >>> gate.cut([[5, 6, 7, 8]], source=0, start=10)      # 0.2 x 2 ms >= 0.1 ms: whole
    [[5, 6, 7, 8]]
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_HITS, PRIOR_MISSES = 1.0, 4.0
MAX_RANKS = 4  # branch ranks counted apart (later ones share the last count)


@dataclass
class _Pending:
    chain: list[int]
    source: int
    rank: int
    start: int  # index in the emitted history of the chain's first token
    shared: int = 0  # leading tokens that were already a path of the head's tree (no row of their own)
    head: int = 0  # tokens the head's path accepted that step (set by `stepped`)


@dataclass
class CopyGate:
    """Per request (make one per generation); `RowPrice` carries the row cost across requests."""

    hits: dict = field(default_factory=dict)  # (source, rank, j) -> extra accepted tokens at position j
    seen: dict = field(default_factory=dict)  # (source, rank, j) -> chains that reached position j
    row_ms: float | None = None
    token_ms: float | None = None
    _pending: list[_Pending] = field(default_factory=list)
    _open: list[_Pending] = field(default_factory=list)  # this step's chains, waiting for `stepped`

    def prices(self, row_ms: float | None, token_ms: float | None) -> None:
        self.row_ms, self.token_ms = row_ms, token_ms

    def yield_at(self, source: int, rank: int, j: int) -> float:
        key = (source, min(rank, MAX_RANKS - 1), j)
        return (self.hits.get(key, 0.0) + PRIOR_HITS) / (self.seen.get(key, 0.0) + PRIOR_HITS + PRIOR_MISSES)

    def cut(self, chains: list[list[int]], source: int, start: int, shared: list[int] | None = None
            ) -> list[list[int]]:
        """Each chain (ranked best first) cut before its first position past `shared[i]` (its leading tokens that
        are a path of the head's tree already) that does not pay; every chain, cut or not, is remembered whole to be
        scored against the text that follows `start`."""
        out = []
        for rank, chain in enumerate(chains):
            free = min(shared[rank], len(chain)) if shared else 0
            pend = _Pending(list(chain), source, rank, start, free)
            self._open.append(pend)
            if self.row_ms is None or self.token_ms is None:
                out.append(chain)
                continue
            n = free
            while n < len(chain) and self.yield_at(source, rank, n + 1) * self.token_ms >= self.row_ms:
                n += 1
            out.append(chain[:n])
        return out

    def stepped(self, head_accepted: int, history: list[int]) -> None:
        """The step's outcome: how many tokens the head's own nodes got accepted; `history` is the emitted text so
        far (prompt included). Scores every chain the text now covers."""
        for pend in self._open:
            pend.head = head_accepted
        self._pending += self._open
        self._open = []
        self._score(history)

    def _score(self, history: list[int]) -> None:
        keep = []
        for pend in self._pending:
            if len(history) < pend.start + len(pend.chain):
                keep.append(pend)
                continue
            rank = min(pend.rank, MAX_RANKS - 1)
            matched = 0
            for tok, got in zip(pend.chain, history[pend.start:]):
                if tok != got:
                    break
                matched += 1
            for j in range(pend.shared + 1, len(pend.chain) + 1):  # the positions that take a row
                key = (pend.source, rank, j)
                self.seen[key] = self.seen.get(key, 0.0) + 1.0
                if pend.head < j <= matched:
                    self.hits[key] = self.hits.get(key, 0.0) + 1.0
        self._pending = keep


class RowPrice:
    """What one more verify row costs in ms on this runner: the least-squares slope of the verify steps' times in
    their row counts, over every step the runner has verified, once the counts spread. (A prefill's time per row is
    no measure of it: a long prefill is compute-bound where a verify pass of tens of rows still streams its
    weights.)"""

    MIN_SPREAD = 4.0  # variance of the steps' row counts before their own slope is trusted
    MIN_STEPS = 8

    def __init__(self):
        self.row_ms: float | None = None
        self._n = self._t = self._y = self._tt = self._ty = 0.0

    def add_step(self, rows: int, ms: float) -> None:
        self._n += 1
        self._t += rows
        self._y += ms
        self._tt += rows * rows
        self._ty += rows * ms
        if self._n >= self.MIN_STEPS:
            mean_t = self._t / self._n
            var = self._tt / self._n - mean_t * mean_t
            if var >= self.MIN_SPREAD:
                slope = (self._ty / self._n - mean_t * self._y / self._n) / var
                if slope > 0:
                    self.row_ms = slope
