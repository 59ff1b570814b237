"""The decode loop: prefill, then draft -> tree -> verify -> accept -> commit KV, until a stop.

    runner = Runner(target, head, capacity=4096)                  # an EAGLE-3 head drafts
    runner = Runner(target, None, capacity=4096, drafter=drafter)  # or any drafter, e.g. a small LM (model_drafter.py)
    result = runner.generate(prompt_ids, DecodeOptions(max_new_tokens=64))
    result.token_ids, result.metrics.acceptance_length

Greedy acceptance makes the output token-identical to plain greedy decoding (`mode="ar"`): every
committed token is the target's own argmax given the tokens before it; the draft only decides how many
of them one target forward can confirm. `mode="eagle"` is speculative decoding with whatever drafter the
runner holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from eagle_trt.errors import InputError
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.drafter import Drafter
from eagle_trt.runtime.tree_drafter import TreeDrafter
from eagle_trt.runtime.metrics import GenerationMetrics, StepRecord
from eagle_trt.speculative.datastore import Datastore
from eagle_trt.runtime.copies import RequestCopies
from eagle_trt.speculative.copy_gate import RowPrice
from eagle_trt.speculative.sampling import SamplingParams, processed_probs, sample
from eagle_trt.speculative.tree import (DEFAULT_STATIC_TREE, StaticLayout, Tree, chain_choices, static_layout,
                                        trim_choices)
from eagle_trt.speculative.verify import verify_greedy, verify_sampling


@dataclass
class DecodeOptions:
    max_new_tokens: int = 128
    mode: Literal["eagle", "ar"] = "eagle"
    tree: Literal["dynamic", "static", "chain"] = "dynamic"
    draft_length: int = 6
    beam_width: int = 8
    total_tokens: int = 32
    confidence_threshold: float = 0.0
    static_tree: list[list[int]] | None = None
    eos_token_ids: list[int] | None = None  # None: the runner's (eagle_trt.eos)
    # Sampling (temperature 0 = greedy). The target's processed distribution is the same in every mode.
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    posterior_threshold: float | None = None  # typical acceptance: LOSSY, opt-in
    posterior_alpha: float = 0.3
    # After `fallback_after` verify steps in a row with nothing accepted, decode `fallback_tokens` plainly.
    fallback_after: int = 2
    fallback_tokens: int = 8
    # Prompt lookup: graft up to this many tokens copied from the context onto each draft tree (0 = off).
    lookup_tokens: int = 0
    lookup_branches: int = 1  # distinct copied continuations per tree (each up to lookup_tokens long)
    datastore_branches: int = 0  # more continuations from the runner's datastore, if it has one
    # Verify rows (root + head's tree + copies) the copies may fill up to; copies are cut to fit (0 = no cap).
    max_verify_rows: int = 0
    # Greedy: cut each copy where its measured yield stops paying for its verify rows (speculative/copy_gate.py).
    # Off here (the copies as configured); an engine's config turns it on (EagleConfig.adaptive_lookup).
    adaptive_lookup: bool = False

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.seed)

    @property
    def lossy(self) -> bool:
        return self.posterior_threshold is not None and self.mode == "eagle"

    def tree_capacity(self) -> int:
        """Upper bound of tree nodes (root included) and of draft scratch slots."""
        return (max(self.total_tokens, self.beam_width * self.draft_length, len(DEFAULT_STATIC_TREE)) + 1
                + max(self.lookup_tokens, 0) * (max(self.lookup_branches, 1) + max(self.datastore_branches, 0)))


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
                 drafter: TreeDrafter | None = None):
        """`head`: an EAGLE-3 head, drafted with by `Drafter`; or `drafter`: any other (runtime/tree_drafter.py)."""
        self.target, self.head = target, head
        self.tree_room = tree_room or capacity  # KV slots set aside for a step's tree (root and copies included)
        # Tokens that end an answer unless a request names its own (`eagle_trt.eos`; default: the target config's).
        self.eos_token_ids = list(eos_token_ids if eos_token_ids is not None else target.spec.eos_token_ids)
        self.datastore = datastore  # a second prompt-lookup source (speculative/datastore.py)
        self.capacity = capacity
        self.max_input_len = max_input_len or capacity
        # Positions the target (and the head, which shares its RoPE range) can take: 0 .. max_positions - 1.
        self.max_positions = target.spec.max_position_embeddings
        if head is not None:
            head_aux = head.spec.aux_layer_ids
            if max(head_aux) >= target.spec.num_layers:
                raise InputError(f"draft head reads target layer {max(head_aux)}, but the target has "
                                 f"{target.spec.num_layers} layers")
            target.aux_layer_ids = list(head_aux)
        self.cache = target.new_cache(capacity, kv_dtype, k_scales, v_scales)
        if head is not None:
            drafter = Drafter(head, capacity, kv_dtype, draft_k_scales, draft_v_scales, self.max_positions)
        self.drafter = drafter
        self.row_price = RowPrice()  # what a verify row costs here, learned across requests (adaptive lookup)
        if drafter is not None:  # a draft model's own RoPE range may be shorter than the target's
            self.max_positions = min(self.max_positions, drafter.max_positions)

    # ---- public ----------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], opts: DecodeOptions,
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        self._check_prompt(prompt_ids, opts)
        eos = set(opts.eos_token_ids if opts.eos_token_ids is not None else self.eos_token_ids)
        metrics = GenerationMetrics(mode=opts.mode if self.drafter is not None else "ar", prompt_tokens=len(prompt_ids),
                                    temperature=opts.temperature, lossy=opts.lossy)
        out: list[int] = []
        self._params = opts.sampling
        self._gen = None
        if not self._params.greedy:
            self._gen = torch.Generator().manual_seed(opts.seed if opts.seed is not None else
                                                      int(torch.randint(0, 2**62, ())))

        def emit(tokens: list[int]) -> bool:
            """Append tokens up to a stop; return True when generation is over."""
            for i, tok in enumerate(tokens):
                out.append(tok)
                if tok in eos or len(out) >= opts.max_new_tokens:
                    metrics.stop_reason = "eos" if tok in eos else "length"
                    metrics.discard(len(tokens) - i - 1)  # a verify step's tokens past the stop
                    tokens = tokens[: i + 1]
                    break
            if on_tokens is not None:
                on_tokens(tokens)
            return bool(metrics.stop_reason)

        t0 = time.perf_counter()
        if opts.mode == "ar" or self.drafter is None:
            self._generate_ar(prompt_ids, emit, metrics)
        else:
            self._generate_eagle(prompt_ids, opts, emit, metrics, left=lambda: opts.max_new_tokens - len(out))
        metrics.total_s = time.perf_counter() - t0
        metrics.generated_tokens = len(out)
        return GenerationResult(out, metrics, list(prompt_ids))

    # ---- loops ------------------------------------------------------------------------------------
    def _pick(self, logits: torch.Tensor) -> int:
        """The next token from one row of target logits: argmax, or a draw from the processed p."""
        if self._params.greedy:
            return int(self.target.argmax(logits.view(1, -1))[0])
        return sample(processed_probs(logits, self._params), self._gen)

    def _next_after(self, ids: torch.Tensor, positions: torch.Tensor,
                    need_aux: bool) -> tuple[int, torch.Tensor | None]:
        """One target forward over ids; the token after the last one (greedy: the LM head's argmax, fused where the
        target has that kernel) and the features, if asked."""
        last = torch.tensor([ids.numel() - 1]) if ids.numel() > 1 else None  # one token: its only row
        if self._params.greedy:
            hidden, aux = self.target.hidden_states(ids, positions, self.cache, need_aux=need_aux, rows=last)
            return int(self.target.greedy(hidden)[0]), aux
        logits, aux = self.target.forward(ids, positions, self.cache, need_aux=need_aux, logits_rows=last)
        return self._pick(logits[-1]), aux

    def _prefill(self, ids: torch.Tensor, need_aux: bool) -> tuple[int, torch.Tensor | None]:
        self.cache.length = 0
        tok, aux = self._next_after(ids, torch.arange(ids.numel()), need_aux)
        self.cache.length = ids.numel()
        return tok, aux

    def _plain_step(self, tok: int, need_aux: bool) -> tuple[int, torch.Tensor | None]:
        n = self.cache.length
        nxt, aux = self._next_after(torch.tensor([tok]), torch.tensor([n]), need_aux)
        self.cache.length = n + 1
        return nxt, aux

    def _generate_ar(self, prompt_ids, emit, metrics) -> None:
        t = time.perf_counter()
        tok, _ = self._prefill(torch.tensor(prompt_ids), need_aux=False)
        metrics.prefill_s = time.perf_counter() - t
        done = emit([tok])
        while not done:
            t = time.perf_counter()
            tok, _ = self._plain_step(tok, need_aux=False)
            metrics.steps.append(StepRecord(0, 0, 0, 0.0, time.perf_counter() - t))
            done = emit([tok])

    def _generate_eagle(self, prompt_ids, opts: DecodeOptions, emit, metrics, left: Callable[[], int]) -> None:
        """`left()`: tokens still to emit before max_new_tokens."""
        layouts = None
        if opts.tree != "dynamic":
            choices = chain_choices(opts.draft_length) if opts.tree == "chain" else (
                opts.static_tree or trim_choices(DEFAULT_STATIC_TREE, opts.draft_length, opts.total_tokens))
            layouts = _StaticLayouts(choices)
        copies = (RequestCopies(prompt_ids, opts, self.datastore, self.row_price, self._params.greedy)
                  if opts.lookup_tokens > 0 else None)
        emit = copies.wrap(emit) if copies is not None else emit
        ids = torch.tensor(prompt_ids)
        need_aux = self.drafter.needs_features  # the target's layer features, only for a drafter that reads them
        t = time.perf_counter()
        root, aux = self._prefill(ids, need_aux=need_aux)
        metrics.prefill_s = time.perf_counter() - t
        if emit([root]):
            return
        t = time.perf_counter()
        self.drafter.start(ids, aux, root)
        carry_draft_s = time.perf_counter() - t
        misses = 0  # verify steps in a row that accepted no draft token
        while True:
            if opts.fallback_after and misses >= opts.fallback_after:
                root, carry_draft_s = self._fallback(root, opts.fallback_tokens, need_aux, emit, metrics)
                if root is None:
                    return
                misses = 0
            n = self.cache.length
            # The deepest node sits at position n + depth: no node (drafted or copied) goes deeper than the tokens
            # still to emit, nor past the model's last position.
            room = min(left(), self.max_positions - 1 - n)
            if room < 1:  # the root's own forward gives the last token
                nxt, _ = self._plain_step(root, need_aux=False)
                if not emit([nxt]):
                    metrics.stop_reason = "context"
                return
            t_draft = time.perf_counter()
            tree, proposals = self._draft(root, opts, layouts, room)
            # Node indices: the drafter's nodes first, then the context's copies, then the datastore's.
            drafted = copied = tree.tokens.numel()
            if copies is not None:
                tree, copied = copies.graft(tree, room)
            t_verify = time.perf_counter()
            # One target forward over root + tree; node i sits at position n + depth(i).
            hidden, aux = self.target.hidden_states(tree.tokens, tree.positions(n), self.cache, tree.mask,
                                                    need_aux=need_aux)
            path, bonus = self._accept(tree, hidden, opts, proposals, metrics)
            # Keep the accepted path's K/V, packed right after the prefix; the rest is dead space.
            self.cache.compact(n, path)
            self.cache.length = n + path.numel()
            t_done = time.perf_counter()
            accepted = tree.tokens[path[1:]].tolist()
            metrics.steps.append(StepRecord(
                len(accepted), tree.size, tree.depth, carry_draft_s + (t_verify - t_draft), t_done - t_verify,
                lookup_accepted=int((path >= drafted).sum()), lookup_size=tree.tokens.numel() - drafted,
                datastore_accepted=int((path >= copied).sum()), datastore_size=tree.tokens.numel() - copied))
            misses = misses + 1 if not accepted else 0
            self.row_price.add_step(tree.tokens.numel(), 1000 * (t_done - t_verify))
            if emit(accepted + [bonus]):
                return
            if copies is not None:
                copies.stepped(path, drafted, carry_draft_s + t_done - t_draft, len(accepted) + 1)
            root = bonus
            t = time.perf_counter()
            self.drafter.extend(aux[path] if need_aux else None, torch.tensor(accepted + [bonus]))
            carry_draft_s = time.perf_counter() - t

    def _fallback(self, root: int, tokens: int, need_aux: bool, emit, metrics) -> tuple[int | None, float]:
        """The drafter keeps missing: decode `tokens` plainly (same target, same p: still lossless), then catch the
        drafter up on them in one batch. Returns (the next root, or None when generation ended; the catch-up time)."""
        metrics.fallbacks += 1
        feats, nexts = [], []
        for _ in range(tokens):
            nxt, feat = self._plain_step(root, need_aux=need_aux)
            feats.append(feat)
            nexts.append(nxt)
            metrics.fallback_tokens += 1
            if emit([nxt]):
                return None, 0.0
            root = nxt
        t = time.perf_counter()
        self.drafter.extend(torch.cat(feats) if need_aux else None, torch.tensor(nexts))
        return root, time.perf_counter() - t

    def _accept(self, tree: Tree, hidden: torch.Tensor, opts: DecodeOptions, proposals, metrics
                ) -> tuple[torch.Tensor, int]:
        """The accepted path (node indices, root first) and the bonus token: greedy, the longest path the target's
        argmax agrees with; at T > 0 (or with typical acceptance), multi-branch rejection sampling."""
        if self._params.greedy and opts.posterior_threshold is None:
            path, bonus = verify_greedy(tree, self._greedy_next(tree, hidden))
            if bonus < 0:
                bonus = int(self.target.greedy(hidden[path[-1:]])[0])
            return path, bonus
        logits = self.target.logits(hidden)
        p = (processed_probs(logits, self._params) if not self._params.greedy
             else torch.softmax(logits.float(), -1))
        outcome = verify_sampling(tree, p, self._gen, opts.posterior_threshold, opts.posterior_alpha, proposals)
        metrics.rejections += outcome.rejections
        return outcome.path, outcome.bonus

    def _draft(self, root: int, opts: DecodeOptions, layouts: "_StaticLayouts | None",
               room: int) -> tuple[Tree, dict[int, torch.Tensor] | None]:
        """The drafter's tree for this step, no deeper than `room`, and the proposal distributions of nodes drawn at
        random (None: every node is a deterministic pick). At T > 0 a drafter that samples draws a chain from its own
        q (verified by min(1, p/q)); otherwise the tree is its top-k picks, point masses to the verifier."""
        sampled = (opts.tree == "chain" and not self._params.greedy and opts.posterior_threshold is None
                   and self.drafter.samples_chains)
        if sampled:
            return self.drafter.draft_sampled_chain(root, min(opts.draft_length, room), self._params, self._gen)
        if layouts is None:
            return self.drafter.draft_dynamic(root, opts.beam_width, min(opts.draft_length, room), opts.total_tokens,
                                              opts.confidence_threshold), None
        return self.drafter.draft_static(root, layouts.within(room)), None

    def _greedy_next(self, tree: Tree, hidden: torch.Tensor) -> torch.Tensor:
        """The target's argmax after each node (-1 where not computed). The LM head is one pass over its weight
        for any row count up to `target.lm_head_rows`, so a tree that fits is scored whole, leaves included (the
        bonus then needs no second pass). A larger one gets logits only where a child is checked (the root and inner
        nodes), and a leaf's only when the accepted path ends there."""
        if tree.tokens.numel() <= self.target.lm_head_rows:
            return self.target.greedy(hidden)
        inner = torch.unique(torch.cat([tree.parents[1:], torch.zeros(1, dtype=torch.long)]))
        target_next = torch.full_like(tree.tokens, -1)
        target_next[inner] = self.target.greedy(hidden[inner])
        return target_next

    def _check_prompt(self, prompt_ids: list[int], opts: DecodeOptions) -> None:
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


class _StaticLayouts:
    """A static tree's layout, and the same tree cut to a smaller depth near the end of an answer (made once per
    depth)."""

    def __init__(self, choices: list[list[int]]):
        self.choices = choices
        self.depth = max(map(len, choices), default=0)
        self._by_depth: dict[int, StaticLayout] = {}

    def within(self, depth: int) -> StaticLayout:
        depth = min(depth, self.depth)
        if depth not in self._by_depth:
            self._by_depth[depth] = static_layout(trim_choices(self.choices, depth, len(self.choices)))
        return self._by_depth[depth]
