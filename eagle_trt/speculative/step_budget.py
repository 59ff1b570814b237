"""The step budget: which requests draft this step, and how much of each drafted tree the verify pass carries, chosen
to maximise the step's expected committed tokens per millisecond. The same budget decides a batch of one (`run`)
and a server's batch.

A step over B requests commits at least one token per decoding request and costs its drafting (each drafting
request's, spent before any node is verified) plus one target forward over all its rows, `cost(rows)`. So

    rate = (decoding requests + expected accepted draft tokens) / (drafting ms + cost(rows))

Two decisions, both on that ratio:

- before drafting (`choose_drafters`): a request drafts when its expected accepted tokens (measured on its own
  recent drafted steps, the server's before it has any) pay for its drafting time and its rows, at the rate the
  step achieves; requests are admitted best first while the ratio rises. A request left plain drafts again after a
  gap that doubles each time drafting loses (`Probe`), so a change in the text is noticed.
- after drafting (`cut_trees`): every drafted node's value is its draft path probability calibrated by the
  acceptance measured at its depth (`DepthCalibration`: this request's, over the server's, over 1); nodes are taken
  in one order of value across the batch (closed under ancestors: a child's value never exceeds its parent's), and
  the kept prefix is the one with the highest ratio (the drafting time is spent by then but still counts: a step
  that drafted long is worth less per ms).

Lossless whatever is chosen: verification keeps only tokens the target itself gives, and only requests whose
acceptance is greedy are budgeted (a sampling request drafts its configured tree so its draws do not depend on what
shares its pass). No model and no timing here: unit-tested on synthetic curves (tests/test_step_budget.py).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


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


class OnlineCost:
    """A cost curve learned from the passes a loop runs, where none was measured up front (`run`): an average per row
    count seen, made non-decreasing in rows (adjacent averages that fall are pooled, each row count weighing alike),
    linear between them and past the last with the slope from the first to the last. Ready once two row counts
    are seen."""

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self.points: dict[int, Ema] = {}
        self._curve: CostCurve | None = None

    @property
    def ready(self) -> bool:
        return len(self.points) >= 2

    def add(self, rows: int, ms: float) -> None:
        self.points.setdefault(rows, Ema(self.alpha)).add(ms)
        self._curve = None

    def __call__(self, rows: float) -> float:
        if self._curve is None:
            xs = sorted(self.points)
            ys = non_decreasing([self.points[x].value for x in xs])
            if len(xs) > 2:  # past the last point: the mean slope, not the last segment's noise
                xs, ys = xs + [2 * xs[-1]], ys + [ys[-1] + (ys[-1] - ys[0]) * xs[-1] / (xs[-1] - xs[0])]
            self._curve = CostCurve(dict(zip(xs, ys)))
        return self._curve(rows)


def non_decreasing(ys: list[float]) -> list[float]:
    """The closest non-decreasing sequence in squares (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [sum, count]
    for y in ys:
        blocks.append([y, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    return [s / n for s, n in blocks for _ in range(int(n))]


class Ema:
    """An exponential moving average that starts at its first value."""

    def __init__(self, alpha: float = 0.2, value: float | None = None):
        self.alpha, self.value = alpha, value

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)

    def get(self, default: float) -> float:
        return default if self.value is None else self.value


class DepthCalibration:
    """How often the drafter's path probabilities come true, per depth: the accepted paths that reached depth d
    over the probability the drafted nodes at depth d gave it (the nodes of one depth are exclusive paths, so their
    probabilities add up to the chance of reaching it). `factor(d)` shrinks towards the parent's factor (the
    server's, for a request; 1 for the server) with `prior` steps' worth of weight."""

    def __init__(self, parent: DepthCalibration | None = None, prior: float = 2.0):
        self.parent, self.prior = parent, prior
        self.seen: list[float] = []  # per depth - 1: accepted paths that reached it
        self.expected: list[float] = []  # per depth - 1: the summed path probability of its nodes

    def observe(self, expected_by_depth: list[float], reached: int) -> None:
        """One verified step: the summed path probability of its drafted nodes per depth (depth 1 first), and how
        deep the accepted path went among them."""
        grow = len(expected_by_depth) - len(self.expected)
        if grow > 0:
            self.seen += [0.0] * grow
            self.expected += [0.0] * grow
        for d, e in enumerate(expected_by_depth):
            self.expected[d] += e
            self.seen[d] += 1.0 if reached > d else 0.0

    def factor(self, depth: int) -> float:
        base = self.parent.factor(depth) if self.parent is not None else 1.0
        d = depth - 1
        if d >= len(self.expected):
            return base
        return (self.seen[d] + self.prior * base) / (self.expected[d] + self.prior)


def node_values(probs: list[float], parents: list[int], depths: list[int], calibration: DepthCalibration) -> list[float]:
    """The calibrated value of each drafted node (the root excluded: probs[j] is node j + 1's path probability,
    parents[j] its parent's node index, 0 the root; parents before children): its path probability times its
    depth's factor, at most its parent's value and at most 1."""
    values: list[float] = []
    for p, parent, depth in zip(probs, parents, depths):
        cap = 1.0 if parent == 0 else values[parent - 1]
        values.append(min(p * calibration.factor(depth), cap))
    return values


def expected_by_depth(probs: list[float], depths: list[int]) -> list[float]:
    """The summed path probability of the nodes at each depth, depth 1 first (for `DepthCalibration.observe`)."""
    out = [0.0] * max(depths, default=0)
    for p, d in zip(probs, depths):
        out[d - 1] += p
    return out


def path_probs(scores: list[float]) -> list[float]:
    """Cumulative draft log-probs -> path probabilities."""
    return [math.exp(s) for s in scores]


@dataclass
class StepShape:
    """What a step holds before its trees: `tokens`, the tokens it commits without any draft (one per decoding
    request); `rows`, its rows besides drafted nodes (roots, plain rows, prefill chunks); `sunk_ms`, drafting time
    spent or committed already."""

    tokens: float
    rows: int
    sunk_ms: float = 0.0

    def rate(self, cost, tokens: float = 0.0, rows: float = 0, ms: float = 0.0) -> float:
        return (self.tokens + tokens) / (self.sunk_ms + ms + cost(self.rows + rows))


@dataclass
class DraftOutlook:
    """What drafting is expected to bring one request this step, from its recent drafted steps: the calibrated values
    of its tree's nodes, best first (before any cut), the tokens its copies add past the drafter's path and the rows
    they take, and the drafting time (growing the tree, the copies, the drafter reading the step's tokens, the
    step's bookkeeping)."""

    values: list[float]
    extra: float
    ms: float
    extra_rows: float = 0.0

    def best(self, shape: StepShape, cost) -> tuple[float, float]:
        """(expected accepted tokens, rows) of the tree cut to its best rate on top of `shape`, copies included."""
        best_rate, best, tokens = -1.0, (self.extra, self.extra_rows), self.extra
        for n in range(len(self.values) + 1):
            if n:
                tokens += self.values[n - 1]
            r = shape.rate(cost, tokens, n + self.extra_rows, self.ms)
            if r > best_rate:
                best_rate, best = r, (tokens, n + self.extra_rows)
        return best


def choose_drafters(outlooks: list[DraftOutlook | None], shape: StepShape, cost) -> list[float]:
    """Which requests draft this step, as each one's gain: the step's rate with its drafting over the rate without
    (inf for an outlook of None: nothing measured yet, it drafts and measures). Each outlook is cut to its best tree on
    the step's shape; requests are added best first (expected tokens over the time they add) while adding one
    raises the step's rate by more than MARGIN. A request drafts when its gain exceeds 1 + MARGIN; a request left
    out gets its gain on top of those chosen."""
    gains = [math.inf if o is None else 0.0 for o in outlooks]
    best = {i: o.best(shape, cost) for i, o in enumerate(outlooks) if o is not None}
    base = cost(shape.rows)

    def worth(i: int) -> float:
        tokens, rows = best[i]
        return tokens / max(outlooks[i].ms + cost(shape.rows + rows) - base, 1e-9)

    tokens = rows = ms = 0.0
    rate = shape.rate(cost)
    left = sorted(best, key=lambda i: -worth(i))
    while left:
        i = left[0]
        t, r = best[i]
        gain = shape.rate(cost, tokens + t, rows + r, ms + outlooks[i].ms) / rate
        if gain <= 1 + MARGIN:
            break
        gains[i], rate = gain, rate * gain
        tokens, rows, ms = tokens + t, rows + r, ms + outlooks[i].ms
        left.pop(0)
    for i in left:
        t, r = best[i]
        gains[i] = shape.rate(cost, tokens + t, rows + r, ms + outlooks[i].ms) / rate
    return gains


# What a gain must exceed 1 by. 0: a margin for costs outside the outlook lost more on `run` of a tuned engine (its
# small trees gain a few percent a step) than it saved a batch, where admission already leaves plain requests
# without a drafter (docs/bench.md).
MARGIN = 0.0


def cut_trees(values: list[list[float]], shape: StepShape, cost) -> list[int]:
    """How many of each drafted tree's best nodes to verify. values[b]: request b's node values (each node's value
    at most its parent's, parents first). Nodes go in one order of value across the batch (ties: the earlier
    request, then the earlier node, so a parent precedes its child); the kept prefix is the one with the highest
    step rate (a prefix, not a marginal test, so a jump in the curve is weighed against every node after it)."""
    flat = sorted(((v, b, j) for b, vs in enumerate(values) for j, v in enumerate(vs)),
                  key=lambda x: (-x[0], x[1], x[2]))
    best_n, best, tokens = 0, shape.rate(cost), 0.0
    for n, (v, _, _) in enumerate(flat, start=1):
        tokens += v
        r = shape.rate(cost, tokens, n)
        if r > best:
            best_n, best = n, r
    counts = [0] * len(values)
    for _, b, _ in flat[:best_n]:
        counts[b] += 1
    return counts


@dataclass
class Probe:
    """When a request the budget leaves plain drafts anyway: after `gap` plain steps in a row; each such probe
    doubles the gap (up to MAX_GAP) until the budget chooses drafting again, which resets it. Never shut off: an
    outlook is an average of a few steps, and only drafting measures it again."""

    MIN_GAP, MAX_GAP = 4, 64
    gap: int = MIN_GAP
    since: int = 0

    def drafts(self, gain: float) -> bool:
        """The budget's verdict this step (the request's gain, `choose_drafters`) -> whether it drafts."""
        if gain > 1 + MARGIN:
            self.gap, self.since = self.MIN_GAP, 0
            return True
        self.since += 1
        if self.since < self.gap:
            return False
        self.gap, self.since = min(2 * self.gap, self.MAX_GAP), 0
        return True


@dataclass
class DraftHistory:
    """One request's (or the server's) drafted steps: averages of its tree's node values by rank, the copies' extra
    tokens and rows, and the drafting ms, and how many steps they average."""

    PRIOR = 2.0  # steps' worth of weight the server's averages keep in a request's outlook
    ALPHA = 0.3

    values: list[Ema] = field(default_factory=list)
    extra: Ema = field(default_factory=lambda: Ema(DraftHistory.ALPHA))
    ms: Ema = field(default_factory=lambda: Ema(DraftHistory.ALPHA))
    extra_rows: Ema = field(default_factory=lambda: Ema(DraftHistory.ALPHA))
    steps: int = 0

    def add(self, values: list[float], extra: float, ms: float, extra_rows: int = 0) -> None:
        """One drafted step: its tree's node values (any order), the copies' extra tokens, its drafting ms, the rows
        its copies took."""
        values = sorted(values, reverse=True)
        while len(self.values) < len(values):
            # A rank first seen now: as if it had been worth nothing before (a smaller tree had no such node).
            self.values.append(Ema(self.ALPHA, 0.0 if self.steps else None))
        for k, ema in enumerate(self.values):
            ema.add(values[k] if k < len(values) else 0.0)
        self.extra.add(extra)
        self.ms.add(ms)
        self.extra_rows.add(extra_rows)
        self.steps += 1

    def outlook(self, server: DraftHistory | None = None) -> DraftOutlook | None:
        """This history's averages, shrunk towards the server's by PRIOR steps' worth while it has few (None while
        neither has any)."""
        mine = self._own() if self.steps else None
        theirs = server._own() if server is not None and server.steps else None
        if mine is None or theirs is None:
            return mine or theirs
        w = self.steps / (self.steps + self.PRIOR)
        n = max(len(mine.values), len(theirs.values))
        pad = lambda v: v + [0.0] * (n - len(v))  # noqa: E731
        values = [w * a + (1 - w) * b for a, b in zip(pad(mine.values), pad(theirs.values))]
        return DraftOutlook(sorted(values, reverse=True), w * mine.extra + (1 - w) * theirs.extra,
                            w * mine.ms + (1 - w) * theirs.ms, w * mine.extra_rows + (1 - w) * theirs.extra_rows)

    def _own(self) -> DraftOutlook:
        return DraftOutlook([e.value for e in self.values], self.extra.value, self.ms.value, self.extra_rows.value)
