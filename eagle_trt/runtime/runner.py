"""What every request decoded here shares: the models (target and drafter), the runner's own KV caches, the
verify-row price learned across requests, the stop tokens and the clock; and `generate`, one request decoded as a
batch of one by the decode loop (runtime/loop.py), the same step `serve` runs over many.

    runner = Runner(target, head, capacity=4096)                  # an EAGLE-3 head drafts
    runner = Runner(target, None, capacity=4096, drafter=drafter)  # or any drafter, e.g. a small LM (model_drafter.py)
    result = runner.generate(prompt_ids, DecodeConfig(max_new_tokens=64))
    result.token_ids, result.metrics.acceptance_length

Each generation's own state is a `Request` (runtime/request.py). Greedy acceptance makes the output token-identical
to plain greedy decoding (`mode="ar"`): every committed token is the target's own argmax given the tokens before it;
the draft only decides how many of them one target forward can confirm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.errors import InputError
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.budget import LoopBudget
from eagle_trt.runtime.drafter import Drafter
from eagle_trt.runtime.loop import DecodeLoop
from eagle_trt.runtime.metrics import GenerationMetrics
from eagle_trt.runtime.tree_drafter import TreeDrafter
from eagle_trt.speculative.copy_gate import RowPrice
from eagle_trt.speculative.datastore import Datastore
from eagle_trt.timing import Clock, TickClock, clock_or_default


@dataclass
class GenerationResult:
    token_ids: list[int]
    metrics: GenerationMetrics
    prompt_ids: list[int] = field(default_factory=list)


class Runner:
    def __init__(self, target: LlamaTarget, head: Eagle3DraftHead | None, capacity: int,
                 kv_dtype: torch.dtype | None = None, k_scales=None, v_scales=None, max_input_len: int | None = None,
                 draft_k_scales=None, draft_v_scales=None, datastore: Datastore | None = None,
                 eos_token_ids: list[int] | None = None, tree_room: int | None = None,
                 drafter: TreeDrafter | None = None, clock: Clock | None = None, budget: bool | None = None):
        """`head`: an EAGLE-3 head, drafted with by `Drafter`; or `drafter`: any other (runtime/tree_drafter.py).
        `clock`: where every timing the decode policies read comes from (eagle_trt/timing.py); the wall clock by
        default, a `TickClock` where a test needs the same decisions under any load. `budget`: greedy requests draft
        and verify only what pays on this machine (runtime/budget.py, its verify-cost curve learned from the passes);
        False: every request drafts its configured tree. By default on, except on a `TickClock`: its readings count
        code paths, not costs, and a budget must weigh costs."""
        self.clock = clock_or_default(clock)
        self.target, self.head = target, head
        self.tree_room = tree_room or capacity  # KV slots set aside for a step's tree (root and copies included)
        # Tokens that end an answer unless a request names its own (`eagle_trt.eos`; default: the target config's).
        self.eos_token_ids = list(eos_token_ids if eos_token_ids is not None else target.spec.eos_token_ids)
        self.datastore = datastore  # a second prompt-lookup source (speculative/datastore.py)
        self.capacity = capacity
        self.max_input_len = max_input_len or capacity
        # Positions the target (and the head, which shares its RoPE range) can take: 0 .. max_positions - 1.
        self.max_positions = target.spec.max_position_embeddings
        # The target layers whose outputs the drafter reads (an EAGLE-3 head's; none for a draft model).
        self.aux_layers: list[int] = []
        if head is not None:
            self.aux_layers = list(head.spec.aux_layer_ids)
            if max(self.aux_layers) >= target.spec.num_layers:
                raise InputError(f"draft head reads target layer {max(self.aux_layers)}, but the target has "
                                 f"{target.spec.num_layers} layers")
        self.cache = target.new_cache(capacity, kv_dtype, k_scales, v_scales)
        if head is not None:
            drafter = Drafter(head, capacity, kv_dtype, draft_k_scales, draft_v_scales, self.max_positions)
        self.drafter = drafter
        self.row_price = RowPrice()  # what a verify row costs here, learned across requests (adaptive lookup)
        if budget is None:
            budget = not isinstance(self.clock, TickClock)
        self.budget = LoopBudget() if budget else None  # learned across requests too
        if drafter is not None:  # a draft model's own RoPE range may be shorter than the target's
            self.max_positions = min(self.max_positions, drafter.max_positions)

    # ---- public ----------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], config: DecodeConfig,
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        """One request, decoded as a batch of one by the decode loop (runtime/loop.py) in the runner's own KV
        caches, its prompt prefilled whole."""
        self.check_prompt(prompt_ids, config)
        loop = DecodeLoop(self, max_batch=1, prefill_chunk=None, size_trees=self.budget is not None)
        slot = loop.admit(prompt_ids, config, on_tokens, own_cache=True)
        while loop.active:
            loop.step()
        request = slot.request
        return GenerationResult(request.output, request.metrics, list(prompt_ids))

    @torch.inference_mode()
    def features_of(self, seq: list[int]) -> torch.Tensor:
        """The target's layer features [len(seq), F] of a whole known sequence, by one prefill over it (what the
        drafter reads; tune's replay). Leaves the KV cache holding seq."""
        ids = torch.tensor(seq)
        self.cache.length = 0
        _, aux = self.target.hidden_states(ids, torch.arange(ids.numel()), self.cache, need_aux=True,
                                           rows=torch.tensor([ids.numel() - 1]), aux_layers=self.aux_layers)
        self.cache.length = ids.numel()
        return aux

    def check_prompt(self, prompt_ids: list[int], opts: DecodeConfig) -> None:
        """An InputError when this prompt and these settings do not fit the engine (context, KV cache, tree room)."""
        if not prompt_ids:
            raise InputError("the prompt is empty: give some text with --prompt")
        if len(prompt_ids) > self.max_input_len:
            raise InputError(f"the prompt has {len(prompt_ids)} tokens, more than max_input_len "
                             f"{self.max_input_len}; shorten it or rebuild the engine with a larger max_input_len")
        need = len(prompt_ids) + opts.max_new_tokens + opts.tree_capacity()
        if opts.tree_capacity() > self.tree_room:
            raise InputError(f"the tree options need up to {opts.tree_capacity()} KV slots a step, more than the "
                             f"{self.tree_room} this engine sets aside for trees; lower --total-tokens, --beam-width x "
                             f"--draft-length or the --lookup-* options, or rebuild with larger tree limits")
        if need > self.capacity:
            raise InputError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({opts.max_new_tokens}) + tree "
                             f"({opts.tree_capacity()}) exceed the KV cache ({self.capacity} slots); "
                             f"lower --max-new-tokens or rebuild with a larger max_output_len")
        if len(prompt_ids) + opts.max_new_tokens > self.max_positions:
            raise InputError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({opts.max_new_tokens}) exceed the "
                             f"model's context of {self.max_positions} positions; lower --max-new-tokens or shorten "
                             f"the prompt")
        vocab = self.target.spec.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise InputError(f"prompt token ids must lie in [0, {vocab})")

