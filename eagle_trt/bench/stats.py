"""Pure statistics for the bench: min/median summaries, speedups measured per repeat, acceptance.

Everything here takes plain numbers and lists, so it is unit-tested without a model.

    >>> summarize([3.0, 1.0, 2.0])["median"]
    2.0
    >>> speedups({"tree": [4.0, 6.0], "ar": [2.0, 2.0]}, ["ar"])["tree"]["ar"]
    {'min': 2.0, 'median': 2.5}
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from eagle_trt.timing import median_seconds  # noqa: F401 - the benchmarks' timing, shared


def summarize(values: list[float]) -> dict:
    """min / median / max / mean of a non-empty list (all 0 for an empty one)."""
    if not values:
        return {"min": 0.0, "median": 0.0, "max": 0.0, "mean": 0.0, "n": 0}
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "mean": statistics.fmean(values), "n": len(values)}


def throughput_per_repeat(runs: list[dict], method: str, repeats: int) -> list[float]:
    """Tokens/s of `method` over the whole prompt set, one value per repeat: sum(tokens) / sum(seconds)."""
    out = []
    for r in range(repeats):
        rows = [x for x in runs if x["method"] == method and x["repeat"] == r]
        secs = sum(x["seconds"] for x in rows)
        out.append(sum(x["tokens"] for x in rows) / secs if secs > 0 else 0.0)
    return out


def speedups(tps: dict[str, list[float]], baselines: list[str]) -> dict[str, dict[str, dict]]:
    """method -> baseline -> {min, median} of the per-repeat ratio tps[method][r] / tps[baseline][r].

    Ratios are taken repeat by repeat (both measured in the same pass over the prompts), so load that
    drifts between repeats hits both sides of a ratio alike."""
    out: dict[str, dict[str, dict]] = {}
    for m, values in tps.items():
        out[m] = {}
        for b in baselines:
            if b not in tps:
                continue
            ratios = [v / w for v, w in zip(values, tps[b]) if w > 0]
            out[m][b] = {"min": min(ratios), "median": statistics.median(ratios)} if ratios else None
    return out


def plain_step_ratios(summary: dict, plain: str = "ar") -> dict[str, dict[str, float]]:
    """Speculative method -> {"verify", "draft"}: its verify pass and its drafting per step, each over one plain
    decoding step (`plain`'s ms per token: 1000 / its median tokens/s). The lever of speculation: a step pays when
    tau exceeds verify + draft in these units. Empty without `plain` or for methods without a draft/verify split.

        >>> plain_step_ratios({"ar": {"tokens_per_second": {"median": 50.0}},
        ...                    "tree": {"tokens_per_second": {"median": 70.0},
        ...                             "verify_ms_per_step": 40.0, "draft_ms_per_step": 10.0}})
        {'tree': {'verify': 2.0, 'draft': 0.5}}
    """
    tps = summary.get(plain, {}).get("tokens_per_second", {}).get("median", 0.0)
    if tps <= 0:
        return {}
    step_ms = 1e3 / tps
    return {m: {"verify": s["verify_ms_per_step"] / step_ms, "draft": s["draft_ms_per_step"] / step_ms}
            for m, s in summary.items()
            if s.get("verify_ms_per_step") is not None and s.get("draft_ms_per_step") is not None}


@dataclass(frozen=True)
class Acceptance:
    tau: float  # tokens committed per verify step (accepted draft tokens + bonus)
    per_depth: list[float]  # P(path reaches depth d | tree that deep)
    steps: int


def acceptance(steps: list[tuple[int, int]]) -> Acceptance:
    """steps: (accepted draft tokens, tree depth) per verify step, pooled over any number of generations."""
    if not steps:
        return Acceptance(1.0, [], 0)
    tau = sum(a + 1 for a, _ in steps) / len(steps)
    depth = max(d for _, d in steps)
    per = []
    for d in range(1, depth + 1):
        eligible = [a for a, dd in steps if dd >= d]
        per.append(sum(a >= d for a in eligible) / len(eligible) if eligible else 0.0)
    return Acceptance(tau, per, len(steps))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def roofline(weight_bytes: int, bandwidth_bytes_s: float) -> float:
    """Upper bound of plain decoding tokens/s when every token streams all weights once from memory."""
    return bandwidth_bytes_s / weight_bytes if weight_bytes > 0 else 0.0


def interpolate(curve: dict[int, float], x: float) -> float:
    """Piecewise-linear value of a measured curve {size: seconds} at x; linear extrapolation past the ends."""
    if not curve:
        raise ValueError("empty curve")
    xs = sorted(curve)
    if len(xs) == 1:
        return curve[xs[0]]
    if x <= xs[0]:
        lo, hi = xs[0], xs[1]
    elif x >= xs[-1]:
        lo, hi = xs[-2], xs[-1]
    else:
        hi = next(v for v in xs if v >= x)
        lo = xs[xs.index(hi) - 1]
        if hi == x:
            return curve[hi]
    y = curve[lo] + (curve[hi] - curve[lo]) * (x - lo) / (hi - lo)
    return max(y, 0.0)
