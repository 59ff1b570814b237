"""The server's Prometheus metrics, under vLLM's names with the `eagle_trt:` prefix (so its dashboards work)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from eagle_trt import timing

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServeMetrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.running = Gauge("eagle_trt:num_requests_running", "Requests being decoded.", registry=r)
        self.waiting = Gauge("eagle_trt:num_requests_waiting", "Requests queued.", registry=r)
        self.prompt_tokens = Counter("eagle_trt:prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter("eagle_trt:generation_tokens", "Tokens generated.", registry=r)
        self.drafts = Counter("eagle_trt:spec_decode_num_drafts", "Speculative verify steps.", registry=r)
        self.draft_tokens = Counter("eagle_trt:spec_decode_num_draft_tokens", "Draft tokens verified.", registry=r)
        self.accepted = Counter("eagle_trt:spec_decode_num_accepted_tokens", "Draft tokens accepted.", registry=r)
        self.accepted_per_pos = Counter("eagle_trt:spec_decode_num_accepted_tokens_per_pos",
                                        "Steps whose accepted path reached this depth.", ["position"], registry=r)
        self.ttft = Histogram("eagle_trt:time_to_first_token_seconds", "Submission to first token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("eagle_trt:time_per_output_token_seconds", "Decode time per generated token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("eagle_trt:e2e_request_latency_seconds", "Submission to the last token.",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.step_requests = Histogram("eagle_trt:iteration_requests", "Requests in one engine step (one shared "
                                       "target forward).", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)

    def finished(self, m, prompt_tokens: int, submitted: float, first_token: float | None) -> None:
        """Account one finished request (m: its GenerationMetrics)."""
        now = timing.now()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(m.generated_tokens)
        if m.mode == "eagle":
            self.drafts.inc(len(m.steps))
            self.draft_tokens.inc(sum(s.tree_size for s in m.steps))
            self.accepted.inc(sum(s.accepted for s in m.steps))
            for depth in range(1, max((s.accepted for s in m.steps), default=0) + 1):
                self.accepted_per_pos.labels(position=str(depth - 1)).inc(sum(s.accepted >= depth for s in m.steps))
        self.e2e.observe(now - submitted)
        if first_token is not None:
            self.ttft.observe(first_token - submitted)
            if m.generated_tokens > 1:
                self.tpot.observe((now - first_token) / (m.generated_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
