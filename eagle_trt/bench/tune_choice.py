"""`eagle-trt tune`, the pure part: candidate settings, the decode-path walk, and the ranking by predicted
tokens/s. No model, no timing: unit-tested on synthetic curves and acceptance tables."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from eagle_trt.bench.stats import interpolate
from eagle_trt.speculative.lookup import copy_budget

TOTALS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)


LOOKUP_OFF = (0, 1, 0)  # (lookup_tokens, lookup_branches, datastore_branches) with prompt lookup off


@dataclass(frozen=True, order=True)
class Setting:
    beam_width: int
    draft_length: int
    total_tokens: int
    lookup_tokens: int = 0  # copies of up to this many tokens grafted on the tree (0 = prompt lookup off)
    lookup_branches: int = 1  # from the context
    datastore_branches: int = 0  # from the datastore
    max_verify_rows: int = 0  # copies cut to fit this many verify rows, root and head's tree included (0 = no cut)
    # The head's candidates whose cumulative draft probability is below this are not verified (0 = keep all): a
    # step then verifies only the rows the head is sure enough of, fewer than total_tokens.
    confidence_threshold: float = 0.0

    @property
    def tree(self) -> "Setting":
        """The head's part alone (lookup off)."""
        return Setting(self.beam_width, self.draft_length, self.total_tokens,
                       confidence_threshold=self.confidence_threshold)

    @property
    def lookup(self) -> tuple[int, int, int]:
        return (self.lookup_tokens, self.lookup_branches, self.datastore_branches) if self.lookup_tokens else LOOKUP_OFF

    def plus(self, lookup: tuple[int, int, int], max_verify_rows: int = 0) -> "Setting":
        return Setting(self.beam_width, self.draft_length, self.total_tokens, *lookup,
                       max_verify_rows if lookup[0] > 0 else 0, self.confidence_threshold)

    @property
    def copy_budget(self) -> int | None:
        """Rows the copies may add (what the runtime passes to `within_rows`); None = no cut."""
        return copy_budget(self.max_verify_rows, self.total_tokens + 1)


def row_caps(tree: Setting, lookup: tuple[int, int, int], caps: list[int]) -> list[int]:
    """The max_verify_rows values worth scoring for this head tree and lookup setting: 0 (no cut), and each cap
    that leaves the copies some rows but fewer than they can take (others equal no cut or lookup off). A tree with
    a confidence threshold is scored uncapped only: the runtime gives the copies what its cut tree leaves of a cap,
    which the replay, pricing copies against the whole tree, would not reproduce."""
    if tree.confidence_threshold > 0:
        return [0]
    most = lookup[0] * (lookup[1] + lookup[2]) if lookup[0] > 0 else 0
    return [0] + sorted({c for c in caps if tree.total_tokens + 1 < c < tree.total_tokens + 1 + most})


def lookup_grid(tokens: list[int], branches: list[int], datastore: list[int], room: int,
                include: list[tuple[int, int, int]] = ()) -> list[tuple[int, int, int]]:
    """Every (lookup_tokens, lookup_branches, datastore_branches) worth scoring: lookup off, and each
    combination with tokens > 0 whose copies fit `room` verify rows; plus `include`."""
    out = {LOOKUP_OFF, *include}
    for t in tokens:
        for b in branches:
            for ds in datastore:
                if t > 0 and b >= 1 and ds >= 0 and t * (b + ds) <= room:
                    out.add((t, b, ds))
    return sorted(out)


def candidate_count(k: int, d: int) -> int:
    """Draft candidates a dynamic tree of beam k and depth d creates (k at depth 1, k*k per later level)."""
    return k + (d - 1) * k * k


def candidate_settings(beams: list[int], max_depth: int, room: int, totals=TOTALS,
                       include: list[Setting] = (), thresholds=(0.0,)) -> list[Setting]:
    """Every (k, d, N) worth scoring: d <= N <= min(candidates, room), k*d <= room, each with every confidence
    threshold of `thresholds`; plus `include`."""
    out = set(include)
    for k in beams:
        for d in range(1, max_depth + 1):
            if k * d > room:
                continue
            top = min(candidate_count(k, d), room)
            for n in {d, *totals}:
                if d <= n <= top:
                    out.update(Setting(k, d, n, confidence_threshold=c) for c in thresholds)
    return sorted(out)


def predict_tps(tau: float, draft_ms: float, extend_ms: float, verify_ms: float, lookup_ms: float = 0.0,
                other_ms: float = 0.0) -> float:
    step = draft_ms + extend_ms + verify_ms + lookup_ms + other_ms
    return 1e3 * tau / step if step > 0 else 0.0


def choose(taus: dict[Setting, float], verify_ms: dict[int, float], draft_ms: dict[tuple[int, int], float],
           extend_ms: dict[int, float], rows: dict[Setting, float | dict[int, float]] | None = None,
           lookup_ms: dict[tuple, float] | None = None, step_ms: float = 0.0) -> list[dict]:
    """Rank settings by predicted tokens/s (best first; ties go to the smaller tree, then to less lookup).

    taus: measured tau per setting; verify_ms: forward ms per token count (root included);
    draft_ms: tree-growing ms per (beam width, depth); extend_ms: head-update ms per accepted count;
    rows: the tokens a setting's steps verify besides the root (the head's kept tree and the copies), either
    the mean or, better, the share of steps verifying each count ({rows: share}): a step's verify cost is read off
    the curve at its own size, so a curve with a step in it (bf16's 32-row chunks) is charged where the steps
    land, not at their mean; a setting not listed verifies its whole tree (total_tokens) every step;
    lookup_ms: ms to find and graft the copies of a lookup setting (both 0 with lookup off); step_ms: the rest of
    a step, the same for every setting (bookkeeping the terms above leave out; `tune.measure_step_overhead`).
    A fixed cost per step favours settings that commit more tokens per step."""
    ranked = []
    for s, tau in taus.items():
        if (s.beam_width, s.draft_length) not in draft_ms:
            continue
        spread = (rows or {}).get(s, float(s.total_tokens))
        if not isinstance(spread, dict):
            spread = {spread: 1.0}
        mean = sum(r * p for r, p in spread.items())
        lk = (lookup_ms or {}).get(s.lookup, 0.0) if s.lookup_tokens else 0.0
        v = sum(p * interpolate(verify_ms, 1 + r) for r, p in spread.items())
        e = interpolate(extend_ms, tau)
        d = draft_ms[(s.beam_width, s.draft_length)]
        ranked.append({**asdict(s), "tau": tau, "draft_ms": d, "extend_ms": e, "verify_ms": v, "verify_rows": 1 + mean,
                       "lookup_ms": lk, "step_ms": step_ms,
                       "predicted_tokens_per_second": predict_tps(tau, d, e, v, lk, step_ms)})
    ranked.sort(key=lambda r: (-r["predicted_tokens_per_second"], r["total_tokens"], r["beam_width"],
                               r["draft_length"], r["lookup_tokens"], r["lookup_branches"], r["datastore_branches"],
                               -r["max_verify_rows"], r["confidence_threshold"]))
    return ranked


def walk(accepted: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The runtime's own path through one sequence, for many settings at once.

    accepted[r, c]: draft tokens setting c gets accepted with its root at the r-th of R consecutive positions,
    the last R tokens but one of the output (acceptance at r capped at the R - r tokens left); rows[r, c]:
    verify rows (whole numbers) it adds there (optional). A step at root r commits accepted + 1 tokens (the
    bonus token is the next root), so the next step's root is r + accepted + 1; a step that reaches the output's
    end commits only what is left, as decoding stops there. Returns per setting the tokens committed, the
    steps, and steps[c, x]: how many of setting c's steps added x rows (one column, x = 0, without `rows`).

    Averaging acceptance over every position instead would over-weight runs of easy tokens (a copied
    stretch of 8 is crossed in one step but holds 8 positions), which is exactly where prompt lookup shines."""
    count, settings = accepted.shape
    at = torch.zeros(settings, dtype=torch.long)
    cols = torch.arange(settings)
    tokens = torch.zeros(settings, dtype=torch.float64)
    bins = int(rows.max()) + 1 if rows is not None and rows.numel() else 1
    spread = torch.zeros(settings, bins, dtype=torch.float64)
    alive = torch.ones(settings, dtype=torch.bool)
    while bool(alive.any()):
        here = at.clamp(max=count - 1)
        a = accepted[here, cols]
        tokens += torch.where(alive, torch.minimum(a + 1, count - at), 0)  # the last step stops at the end
        x = rows[here, cols].long() if rows is not None else torch.zeros(settings, dtype=torch.long)
        spread[cols, x] += alive.double()
        at = at + a + 1
        alive &= at < count
    return tokens, spread.sum(1), spread


def setting_of(row: dict) -> Setting:
    """The Setting a ranked row describes."""
    return Setting(**{f: row[f] for f in Setting.__dataclass_fields__ if f in row})


def finalists(ranked: list[dict], default: dict | None, n: int, extra: list[dict | None] = ()) -> list[Setting]:
    """The n best-predicted settings, then `extra` and the build default (no duplicates), in that order."""
    picked = [setting_of(r) for r in ranked[:max(n, 0)]]
    picked += [setting_of(r) for r in (*extra, default) if r is not None]
    return list(dict.fromkeys(picked))


def run_name(s: Setting, fallback_after: int) -> str:
    lookup = f"+lookup{s.lookup_tokens}x{s.lookup_branches}+{s.datastore_branches}" if s.lookup_tokens else ""
    lookup += f"/rows{s.max_verify_rows}" if s.max_verify_rows else ""
    sure = f"/p{s.confidence_threshold:g}" if s.confidence_threshold else ""
    return f"{s.beam_width}x{s.draft_length}x{s.total_tokens}{sure}{lookup}/fallback{fallback_after}"
