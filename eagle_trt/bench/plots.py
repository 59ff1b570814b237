"""PNG plots of a bench run (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(results: dict, out: Path) -> list[Path]:
    """tokens_per_second.png, tau_histogram.png and (with machine measurements) verify_cost.png."""
    plt = _pyplot()
    paths = []
    summary = results["summary"]

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(summary)
    med = [summary[m]["tokens_per_second"]["median"] for m in names]
    lo = [med[i] - summary[m]["tokens_per_second"]["min"] for i, m in enumerate(names)]
    hi = [summary[m]["tokens_per_second"]["max"] - med[i] for i, m in enumerate(names)]
    bars = ax.bar(names, med, yerr=[lo, hi], capsize=4, color="#4c72b0")
    for b, v in zip(bars, med):
        ax.annotate(f"{v:.1f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    ax.set_ylabel("tokens/s (median, bars: min..max over repeats)")
    ax.set_title("Decoding throughput per method")
    fig.tight_layout()
    paths.append(out / "tokens_per_second.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    spec = {m: s["tau_per_prompt"] for m, s in summary.items() if s["tau_per_prompt"]}
    if spec:
        top = max(max(v) for v in spec.values())
        bins = [1 + i * 0.25 for i in range(int((max(top, 1.25) - 1) / 0.25) + 2)]
        ax.hist(list(spec.values()), bins=bins, label=list(spec), alpha=0.8)
        ax.set_xticks(bins)
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no speculative method in this run", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("acceptance length τ per prompt (tokens per verify step)")
    ax.set_ylabel("prompts")
    ax.set_title("Acceptance length distribution")
    fig.tight_layout()
    paths.append(out / "tau_histogram.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    machine = results.get("machine")
    if machine and machine.get("forward_ms"):
        curve = sorted((int(k), v) for k, v in machine["forward_ms"].items())
        fig, ax = plt.subplots(figsize=(7, 4))
        xs, ys = [c[0] for c in curve], [c[1] for c in curve]
        ax.plot(xs, ys, "o-", label="measured target forward")
        ax.plot(xs, [ys[0] * x for x in xs], "--", color="gray", label="T × 1-token forward")
        ax.set_ylim(0, max(ys) * 1.3)
        ax.set_xlabel("tokens in one forward (tree size incl. root)")
        ax.set_ylabel("ms")
        ax.set_title(f"Verify cost after {machine['context_tokens']} cached tokens")
        ax.legend()
        fig.tight_layout()
        paths.append(out / "verify_cost.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
