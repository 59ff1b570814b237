"""Per-generation statistics: acceptance length tau, acceptance per depth, time split, tree use."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepRecord:
    accepted: int  # draft tokens accepted this verify step (bonus excluded)
    tree_size: int  # draft tokens in the tree
    tree_depth: int
    draft_s: float
    verify_s: float
    lookup_accepted: int = 0  # of `accepted`, tokens that came from prompt-lookup branches (datastore included)
    lookup_size: int = 0  # draft tokens the prompt-lookup branches added to the tree (datastore included)
    datastore_accepted: int = 0  # of lookup_accepted, tokens from the datastore's branches
    datastore_size: int = 0  # of lookup_size, tokens the datastore's branches added


@dataclass
class GenerationMetrics:
    mode: str
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    total_s: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    stop_reason: str = ""
    temperature: float = 0.0
    lossy: bool = False  # typical acceptance was on: output may differ from the target's distribution
    rejections: int = 0  # sampled draft tokens rejected (T > 0 or typical acceptance)
    fallbacks: int = 0  # times the loop switched to plain decoding after repeated misses
    fallback_tokens: int = 0  # tokens produced by those plain-decoding stretches
    # Tokens a shared verify pass decoded plainly because drafting did not pay at that batch width (runtime/loop.py)
    undrafted_tokens: int = 0
    discarded_tokens: int = 0  # tokens the last verify step accepted past the stop (EOS or max_new_tokens)

    def discard(self, n: int) -> None:
        """The last step's final n tokens fell past the stop and were not emitted: count only what it committed,
        so tau is committed tokens per verify step."""
        if n <= 0 or not self.steps:
            return
        step = self.steps[-1]
        step.accepted = max(step.accepted - n, 0)
        step.lookup_accepted = min(step.lookup_accepted, step.accepted)
        step.datastore_accepted = min(step.datastore_accepted, step.lookup_accepted)
        self.discarded_tokens += n

    @property
    def verify_steps(self) -> int:
        return len(self.steps)

    @property
    def acceptance_length(self) -> float:
        """tau: tokens committed per verify step (accepted draft tokens + the bonus token)."""
        if not self.steps:
            return 1.0
        return sum(s.accepted + 1 for s in self.steps) / len(self.steps)

    def acceptance_per_depth(self) -> list[float]:
        """Fraction of steps whose accepted path reached depth d, among steps whose tree was that deep."""
        depth = max((s.tree_depth for s in self.steps), default=0)
        out = []
        for d in range(1, depth + 1):
            eligible = [s for s in self.steps if s.tree_depth >= d]
            out.append(sum(s.accepted >= d for s in eligible) / len(eligible) if eligible else 0.0)
        return out

    @property
    def draft_s(self) -> float:
        return sum(s.draft_s for s in self.steps)

    @property
    def verify_s(self) -> float:
        return sum(s.verify_s for s in self.steps)

    @property
    def tree_utilization(self) -> float:
        """Accepted draft tokens / draft tokens verified."""
        verified = sum(s.tree_size for s in self.steps)
        return sum(s.accepted for s in self.steps) / verified if verified else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "verify_steps": self.verify_steps,
            "acceptance_length": round(self.acceptance_length, 4),
            "acceptance_per_depth": [round(a, 4) for a in self.acceptance_per_depth()],
            "tokens_per_second": round(self.tokens_per_second, 3),
            "prefill_ms": round(self.prefill_s * 1e3, 2),
            "draft_ms": round(self.draft_s * 1e3, 2),
            "verify_ms": round(self.verify_s * 1e3, 2),
            "total_ms": round(self.total_s * 1e3, 2),
            "mean_tree_size": round(sum(s.tree_size for s in self.steps) / max(len(self.steps), 1), 2),
            "tree_utilization": round(self.tree_utilization, 4),
            "stop_reason": self.stop_reason,
            "temperature": self.temperature,
            "lossy": self.lossy,
            "rejections": self.rejections,
            "fallbacks": self.fallbacks,
            "fallback_tokens": self.fallback_tokens,
            "undrafted_tokens": self.undrafted_tokens,
            "discarded_tokens": self.discarded_tokens,
            "lookup_tokens_verified": sum(s.lookup_size for s in self.steps),
            "lookup_tokens_accepted": sum(s.lookup_accepted for s in self.steps),
            "datastore_tokens_verified": sum(s.datastore_size for s in self.steps),
            "datastore_tokens_accepted": sum(s.datastore_accepted for s in self.steps),
        }
