"""Batch-aware speculation: how much of each request's draft a shared verify pass should carry.

One verify pass over B requests costs `cost(rows)`, read off the target's measured forward curve (a pass of tens of
rows streams the weights once, so rows are nearly free at first and then cost compute). A request whose draft is
verified commits 1 + (the draft tokens accepted) tokens, a plain one commits 1. Two decisions, both to maximise
the batch's committed tokens per millisecond:

- `ModeChooser`, whether the batch drafts at all at its width: measured, segment by segment, drafting against plain
  decoding (drafting costs per request, catching the drafters up after plain steps, bookkeeping: a model of all of
  that would be wrong somewhere, the measured rate is not). Where the pass's rows cost compute (many requests, or
  bf16 without hardware bf16) drafting stops paying and the batch runs as batched plain decoding.
- `tree_sizes`, after drafting: how many nodes of each drafted tree to verify. A node's chance of being accepted is
  estimated by its draft path probability (the product of the drafter's probabilities down to it; EAGLE's drafts are
  close to calibrated), so the expected tokens of a tree cut to its n best nodes is 1 + the sum of their
  probabilities, and the best cut over the batch takes nodes in one global order of probability, each row's time
  valued at the tokens per ms the batch achieves.

Lossless whatever is chosen: verification keeps only tokens the target itself gives, and only the requests whose
acceptance is greedy are resized (a sampling request's random draws must not depend on what shares its pass).
No model and no timing here: unit-tested on synthetic curves.
"""

from __future__ import annotations

import bisect
import math


class CostCurve:
    """Milliseconds of one target forward per row count, linear between measured points and past the last one
    (extended with the slope of its last two points)."""

    def __init__(self, points: dict[int, float]):
        if not points:
            raise ValueError("a cost curve needs at least one measured point")
        self.rows = sorted(points)
        self.ms = [float(points[r]) for r in self.rows]

    def __call__(self, rows: float) -> float:
        xs, ys = self.rows, self.ms
        if len(xs) == 1:
            return ys[0] * max(rows, 1) / xs[0]
        if rows <= xs[0]:
            return ys[0]
        i = bisect.bisect_left(xs, rows)
        if i == len(xs):  # past the end: the last segment's slope
            i -= 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)


def width_class(n: int) -> int:
    """The batch widths the mode chooser tells apart: 0, 1, 2, then powers of two (3-4 -> 4, 5-8 -> 8, ...)."""
    return n if n <= 2 else 1 << (n - 1).bit_length()


class ModeChooser:
    """Whether a batch of a given width (class, `width_class`) drafts, decided by measurement: steps run in segments
    of SEGMENT steps in one mode, drafting or plain (a try takes TRY steps); each segment's committed tokens per ms,
    everything it cost included (drafting, catching the drafters up, verifying, bookkeeping), go into that width's
    average for its mode, and the next segment takes the faster mode. The slower one is tried again after `gap`
    segments' worth of steps, and every time it loses again the gap doubles (up to MAX_GAP), so where one mode is
    clearly faster the other costs little. A width not measured yet first takes the mode that leads at the nearest
    measured one, then tries the other; the first width of all tries drafting, then plain."""

    SEGMENT, TRY, MAX_GAP = 16, 6, 32

    def __init__(self):
        self.rates: dict[tuple[int, str], Ema] = {}
        self._gap: dict[int, int] = {}  # segments of the leading mode between tries of the other
        self._since: dict[int, int] = {}  # steps of the leading mode since the last try
        self._trying: dict[int, bool] = {}

    def rate(self, width: int, mode: str) -> float | None:
        ema = self.rates.get((width, mode))
        return None if ema is None else ema.value

    def choose(self, width: int) -> str:
        draft, plain = self.rate(width, "draft"), self.rate(width, "plain")
        if draft is None and plain is None:
            near = self._nearest(width)  # a width not measured yet starts where the nearest measured one stands
            return self._leader(near) if near is not None else "draft"
        if draft is None or plain is None:  # then measures the other here too
            return "draft" if draft is None else "plain"
        best, other = ("draft", "plain") if draft >= plain else ("plain", "draft")
        if self._since.get(width, 0) >= self._gap.get(width, 2) * self.SEGMENT:
            self._since[width] = 0
            self._trying[width] = True
            return other
        self._trying[width] = False
        return best

    def record(self, width: int, mode: str, tokens: int, ms: float, steps: int = SEGMENT) -> None:
        """A segment's outcome: `tokens` committed in `ms` over `steps` steps in `mode`."""
        if ms <= 0:
            return
        before = self._leader(width)
        self.rates.setdefault((width, mode), Ema(0.3)).add(tokens / ms)
        after = self._leader(width)
        if before is None or after is None:
            return
        if mode == before:
            self._since[width] = self._since.get(width, 0) + steps
            return
        gap = self._gap.get(width, 2)
        # The tried mode lost again: wait twice as long; it took the lead: look back again soon.
        self._gap[width] = min(2 * gap, self.MAX_GAP) if after == before else 2

    def exploring(self, width: int) -> bool:
        """Whether the mode `choose` just gave for this width is a try (its segment is short): of the slower mode,
        or of either while this width has not measured both."""
        return self._leader(width) is None or self._trying.get(width, False)

    def best_rate(self, width: int) -> float | None:
        """The faster mode's tokens per ms at this width (or the nearest measured width): what the batch's time
        is worth."""
        near = width if self._leader(width) is not None else self._nearest(width)
        if near is None:
            return None
        return max(self.rate(near, "draft"), self.rate(near, "plain"))

    def _nearest(self, width: int) -> int | None:
        both = [w for w in {w for w, _ in self.rates} if self._leader(w) is not None]
        return min(both, key=lambda w: (abs(w - width), w)) if both else None

    def _leader(self, width: int) -> str | None:
        draft, plain = self.rate(width, "draft"), self.rate(width, "plain")
        if draft is None or plain is None:
            return None
        return "draft" if draft >= plain else "plain"


def tree_sizes(node_probs: list[list[float]], fixed_rows: int, cost: CostCurve, rate: float) -> list[int]:
    """How many nodes of each drafted tree to verify. node_probs[b]: the draft path probability of each of request
    b's nodes (root excluded); `fixed_rows`: the pass's rows besides these nodes (roots, plain rows, prefill chunks);
    `rate`: tokens per ms the batch achieves, what the pass's time is worth elsewhere.

    Nodes are taken in one order of probability across the batch (within a tree that order is closed under
    ancestors: a child's probability is never above its parent's); the cut is the prefix with the most expected
    tokens net of its time's worth, sum(p) - rate * cost(rows) (a prefix, not a marginal test, so a jump in the
    curve is weighed against every node after it). Returns per request the count of its best nodes to keep."""
    flat = sorted(((p, b, j) for b, probs in enumerate(node_probs) for j, p in enumerate(probs)),
                  key=lambda x: (-x[0], x[1], x[2]))
    base = cost(fixed_rows)
    best_n, best, tokens = 0, 0.0, 0.0
    for n, (p, _, _) in enumerate(flat, start=1):
        tokens += p
        net = tokens - rate * (cost(fixed_rows + n) - base)
        if net > best:
            best_n, best = n, net
    counts = [0] * len(node_probs)
    for _, b, _ in flat[:best_n]:
        counts[b] += 1
    return counts


def path_probs(scores: list[float]) -> list[float]:
    """Cumulative draft log-probs -> path probabilities."""
    return [math.exp(s) for s in scores]


class Ema:
    """An exponential moving average that starts at its first value."""

    def __init__(self, alpha: float = 0.2, value: float | None = None):
        self.alpha, self.value = alpha, value

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)

    def get(self, default: float) -> float:
        return default if self.value is None else self.value
