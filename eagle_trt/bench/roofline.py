"""Machine measurements shared by `bench` and `tune`: memory bandwidth, weight bytes, forward-cost curves.

Plain decoding reads every target weight once per token, so its ceiling on this machine is
bandwidth / weight bytes (the roofline). A tree forward over T tokens reads the same weights once for
all T, which is why verifying 16 draft tokens can cost little more than decoding one.
"""

from __future__ import annotations

import torch

from eagle_trt.bench.methods import DRAFT_SHARE_METHODS
from eagle_trt.runtime.verify_cost import default_sizes, forward_curve  # noqa: F401 - bench's and tune's too
from eagle_trt.timing import Clock, best_seconds


def copy_bandwidth(megabytes: int = 256, reps: int = 5, clock: Clock | None = None) -> float:
    """Memory copy bandwidth in bytes/s: (read + write bytes) / time of the fastest of `reps` `dst.copy_(src)`.

    The fastest, not the median: the roofline is a ceiling, and on a shared machine other work only ever slows a
    copy, so the best repeat is the nearest to what the memory can do."""
    n = max(megabytes, 1) * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / best_seconds(lambda: dst.copy_(src), reps, clock=clock)


def target_weight_bytes(target) -> int:
    """Bytes of target weights one decode step streams: every layer, the final norm, the LM head.

    The embedding table is excluded (a step reads one row of it) unless it is also the LM head."""
    tensors = [target.norm, target.lm_head.w]
    for lw in target.layers:
        tensors += [getattr(t, "w", t) for t in vars(lw).values() if t is not None]
    seen, total = set(), 0
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def measure_machine(target, context: int, max_tree: int, bandwidth_mb: int = 256, reps: int = 5,
                    aux_layers: list[int] = (), earlier_bandwidth: tuple[float, ...] = ()) -> dict:
    """Copy bandwidth, target weight bytes and the forward-cost curve, measured now on this machine.

    `earlier_bandwidth`: copy bandwidths (bytes/s) measured earlier in the same run (bench takes one before it
    decodes); the roofline takes the best of those and this one, for the reason copy_bandwidth gives."""
    samples = [*earlier_bandwidth, copy_bandwidth(bandwidth_mb)]
    return {
        "copy_bandwidth_gb_s": max(samples) / 1e9,
        "copy_bandwidth_samples_gb_s": [b / 1e9 for b in samples],
        "weight_bytes": target_weight_bytes(target),
        "context_tokens": context,
        "forward_ms": {t: s * 1e3 for t, s in forward_curve(target, default_sizes(max_tree), context, reps,
                                                                      aux_layers).items()},
        "threads": torch.get_num_threads(),
    }


def derive(machine: dict, summary: dict) -> dict:
    """Roofline figures from measure_machine() and the bench summary (pure arithmetic)."""
    weight_bytes = machine["weight_bytes"]
    roof = machine["copy_bandwidth_gb_s"] * 1e9 / weight_bytes if weight_bytes else 0.0
    curve = {int(k): v for k, v in machine["forward_ms"].items()}
    out = {"roofline_tokens_per_second": roof, "weight_mb_per_token": weight_bytes / 1e6}
    for name in ("ar", "hf"):
        if name in summary and roof > 0:
            out[f"{name}_fraction_of_roofline"] = summary[name]["tokens_per_second"]["median"] / roof
    if 1 in curve and 16 in curve and curve[1] > 0:
        out["forward_16_over_1"] = curve[16] / curve[1]
    for name in DRAFT_SHARE_METHODS:
        share = summary.get(name, {}).get("draft_share")
        if share is not None:
            out[f"{name}_draft_share"] = share
    return out
