"""Is the server's model the target being converted? Its greedy answers, scored under the local target.

    agree = Agreement()
    agree.add(teacher_forced(model, prompt_ids, answer_ids))
    agree.rate >= MIN_AGREEMENT

Teacher forcing, not a second free-running generation: one forward of the local target over prompt + the server's
answer gives the target's own greedy choice at every answer position *given the server's tokens before it*. Where the
server runs the same weights, every position agrees but for near-ties that another dtype or kernel order can flip
(bf16 against fp32, say), and one flip costs one position, not the rest of the answer as a free-running comparison
would. Another model (another size, a fine-tune, another quantisation of different weights) disagrees at a large
share of positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The share of answer positions where the server's token must be the local target's greedy choice. Same weights in
# another dtype flip only near-ties (well under a tenth of the positions); another model misses far more.
MIN_AGREEMENT = 0.9


@dataclass
class Mismatch:
    position: int  # in the answer
    served: int
    target: int


@dataclass
class Agreement:
    matched: int = 0
    compared: int = 0
    first: Mismatch | None = None
    answers: int = 0

    def add(self, scored: tuple[int, int, Mismatch | None]) -> None:
        matched, compared, first = scored
        self.matched += matched
        self.compared += compared
        self.answers += 1
        if self.first is None:
            self.first = first

    @property
    def rate(self) -> float:
        return self.matched / self.compared if self.compared else 1.0


def teacher_forced(model, prompt: list[int], answer: list[int]) -> tuple[int, int, Mismatch | None]:
    """(positions where the answer's token is the target's argmax, positions compared, the first that is not)."""
    if not answer:
        return 0, 0, None
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(answer[:-1])], dtype=torch.long, device=device)
    with torch.inference_mode():
        # Only the logits that predict the answer: position len(prompt) - 1 + j predicts answer[j].
        logits = model(input_ids=ids, logits_to_keep=len(answer)).logits[0]
    picks = logits.float().argmax(-1).cpu().tolist()
    first = next((Mismatch(j, int(a), int(p)) for j, (a, p) in enumerate(zip(answer, picks)) if a != p), None)
    return sum(int(a == p) for a, p in zip(answer, picks)), len(answer), first
