"""One generation's own state: everything that differs between two requests decoded by the same runner.

    request = Request.new(prompt_ids, config, default_eos=[2], drafting=True)
    request.commit([17, 42])      # append up to a stop (EOS, max_new_tokens); True once the request is over
    request.output, request.metrics.stop_reason

The runner holds only what requests share (the models, the verify-row price); a request holds its KV regions, its
token ids, sampling parameters and random generator, its prompt-lookup index and copy gate, its stop state, its
metrics and its output. Any number of requests can exist at once: nothing here points at a runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.metrics import GenerationMetrics
from eagle_trt.speculative.copy_gate import CopyGate
from eagle_trt.speculative.lookup import NgramIndex
from eagle_trt.speculative.sampling import SamplingParams, processed_probs, sample


@dataclass
class Request:
    prompt_ids: list[int]
    config: DecodeConfig
    eos: frozenset[int]
    sampling: SamplingParams
    generator: torch.Generator | None  # None: greedy, nothing is drawn
    metrics: GenerationMetrics
    on_tokens: Callable[[list[int]], bool | None] | None = None
    # Prompt lookup: the n-gram index over prompt + output (None: lookup is off) and the gate that cuts copies where
    # they stop paying (greedy acceptance only; speculative/copy_gate.py).
    index: NgramIndex | None = None
    gate: CopyGate | None = None
    output: list[int] = field(default_factory=list)
    # The request's KV regions: the target's cache and the drafter that keeps its own (the runner's when requests
    # take turns, each request's own when they share verify passes, runtime/loop.py).
    cache: object = None
    drafter: object = None
    # Between speculative steps: the root (chosen by the target, not yet in its KV cache), the request's proposers
    # (runtime/proposers.py), and the drafter catch-up time the next step is charged with.
    root: int | None = None
    proposers: list = field(default_factory=list)
    carry_draft_s: float = 0.0
    misses: int = 0  # verify steps in a row that accepted no draft token (for the fallback)
    committed_tokens: int = 0  # tokens the verify steps committed (accepted + bonus) and the time they took:
    committed_s: float = 0.0  # what a token is worth to the copy gate

    @classmethod
    def new(cls, prompt_ids: list[int], config: DecodeConfig, default_eos: list[int], drafting: bool,
            on_tokens: Callable[[list[int]], bool | None] | None = None) -> Request:
        """drafting: the runner has a drafter and config.mode is eagle (else this is plain decoding)."""
        sampling = SamplingParams(config.temperature, config.top_p, config.top_k, config.seed)
        generator = None
        if not sampling.greedy:
            seed = config.seed if config.seed is not None else int(torch.randint(0, 2**62, ()))
            generator = torch.Generator().manual_seed(seed)
        eos = frozenset(config.eos_token_ids if config.eos_token_ids is not None else default_eos)
        metrics = GenerationMetrics(mode="eagle" if drafting else "ar", prompt_tokens=len(prompt_ids),
                                    temperature=config.temperature, lossy=config.lossy)
        index = gate = None
        if drafting and config.lookup_tokens > 0:
            index = NgramIndex()
            index.extend(prompt_ids)
            if config.adaptive_lookup and sampling.greedy and config.posterior_threshold is None:
                gate = CopyGate()
        return cls(list(prompt_ids), config, eos, sampling, generator, metrics, on_tokens, index, gate)

    # ---- state ------------------------------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    @property
    def greedy_acceptance(self) -> bool:
        """Verification keeps exactly the target's argmax path (no sampling, no typical acceptance)."""
        return self.greedy_acceptance_of(self.config)

    @staticmethod
    def greedy_acceptance_of(config: DecodeConfig) -> bool:
        """`greedy_acceptance` of a request with this config, before it is made (the loop's admission)."""
        return config.temperature <= 0.0 and config.posterior_threshold is None

    @property
    def left(self) -> int:
        """Tokens still to emit before max_new_tokens."""
        return self.config.max_new_tokens - len(self.output)

    @property
    def done(self) -> bool:
        return bool(self.metrics.stop_reason)

    @property
    def token_ms(self) -> float | None:
        """What one committed token has cost so far in this request (drafting and verifying), in ms."""
        return 1000 * self.committed_s / self.committed_tokens if self.committed_tokens else None

    # ---- transitions --------------------------------------------------------------------------------
    def pick(self, logits: torch.Tensor, argmax: Callable[[torch.Tensor], torch.Tensor]) -> int:
        """The next token from one row of target logits: `argmax` (the target's own), or a draw from processed p."""
        if self.sampling.greedy:
            return int(argmax(logits.view(1, -1))[0])
        return sample(processed_probs(logits, self.sampling), self.generator)

    def commit(self, tokens: list[int]) -> int:
        """Append tokens up to a stop (an EOS token, or max_new_tokens); returns how many were kept. Tokens past the
        stop are dropped, and counted in metrics.discarded_tokens."""
        kept = len(tokens)
        for i, tok in enumerate(tokens):
            if tok in self.eos or len(self.output) + i + 1 >= self.config.max_new_tokens:
                self.metrics.stop_reason = "eos" if tok in self.eos else "length"
                kept = i + 1
                break
        self.metrics.discarded_tokens += len(tokens) - kept
        tokens = tokens[:kept]
        self.output.extend(tokens)
        if self.index is not None:
            self.index.extend(tokens)
        # A callback that returns True ends the request here (a server's stop string, a client gone).
        if self.on_tokens is not None and self.on_tokens(tokens) and not self.metrics.stop_reason:
            self.metrics.stop_reason = "stopped"
        return kept
