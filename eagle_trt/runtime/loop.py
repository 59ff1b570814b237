"""The decode loop, for one request (`run`, a batch of one) and for many (`serve`): every active request's rows share
each target forward.

    loop = DecodeLoop(runner, max_batch=8, cost=CostCurve(forward_ms))
    slot = loop.admit(prompt_ids, config, on_tokens)   # None while the batch or the KV budget is full
    while loop.active:
        for slot in loop.step(): slot.request.output, slot.request.metrics   # requests that ended this step

One step (`step`), for B requests:

    plan     each request's work: a chunk of its prompt (prefill), one plain row, or a draft tree
             (`speculative/batch_sizing.py`: whether the batch drafts at its width, measured segment by segment,
             then how much of each tree to verify)
    draft    the drafting requests' proposers: EAGLE-3 trees of several requests grown together, each level in one
             head forward over all of them (`runtime/batch_drafting.py`), each on its own head cache; then each
             request's copies
    forward  ONE target forward over every request's rows (`LlamaTarget.batched_hidden_states`), each request
             against its own KV cache with its own positions and mask; the greedy rows of all of them through the
             LM head in one more call
    resolve  each request accepts and commits on its own (`runtime/commit.py`); the drafters then read their
             accepted paths in one more shared head forward

Each rule lives here once: prefill (chunked, whole for a batch of one), the plain step and its token, the fallback
after misses, the context's end, the step record, drafting and the drafters' catch-up, the totals.

Lossless whatever shares the pass: the kernels keep every row a function of that row (tests/test_native_stack.py
checks a request's rows bit for bit batched against alone), so each greedy answer is the target's own argmax chain,
`run --mode ar`'s tokens. A sampling request always drafts its own configured tree and draws from its own generator,
so a seeded answer does not depend on the batch either.
"""

from __future__ import annotations

from typing import Callable

import torch

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.errors import InputError
from eagle_trt.models.llama import Rows
from eagle_trt.runtime.batch_drafting import batchable, extend_together, grow_together
from eagle_trt.runtime.batch_slot import Slot, State, Work, kv_scales
from eagle_trt.runtime.budget import LoopBudget
from eagle_trt.runtime.commit import Verified, accept, commit, scored_rows
from eagle_trt.runtime.metrics import StepRecord
from eagle_trt.runtime.proposers import DRAFTER, DraftTree, request_proposers
from eagle_trt.runtime.request import Request
from eagle_trt.runtime.tree_drafter import min_score_of
from eagle_trt.speculative.step_budget import CostCurve, Ema
from eagle_trt.timing import TickClock


class DecodeLoop:
    def __init__(self, runner, max_batch: int = 8, kv_budget_bytes: int | None = None,
                 cost: CostCurve | None = None, prefill_chunk: int | None = 256, size_trees: bool = True):
        """`runner`: what requests share (runtime/runner.py: the models, the runner's own KV caches, the verify-row
        price, the clock). `cost`: the target's forward ms per row count (the verify-cost curve); without it every
        request drafts its configured tree. `prefill_chunk`: prompt rows a step takes in all, so a long prompt does
        not stall the requests already decoding (None: every prompt whole)."""
        self.runner, self.max_batch, self.kv_budget = runner, max_batch, kv_budget_bytes
        self.clock = runner.clock  # the runner's: one source for every timing a decision reads
        self.prefill_chunk = prefill_chunk
        # Who drafts and how much of each tree is verified (runtime/budget.py): on a measured curve, or the runner's
        # own budget, which learns the curve from the passes (None: every request drafts its configured tree).
        self.budget = None
        if size_trees:
            # On a counted clock a pass's readings are no cost: a measured curve is then kept as given.
            self.budget = (LoopBudget(cost, learn=not isinstance(self.clock, TickClock)) if cost is not None
                           else runner.budget)
        self.active: list[Slot] = []
        # What a committed token costs this loop, everything in its steps counted: what a copied row must buy back
        # (the copy gate's token worth, speculative/copy_gate.py).
        self.token_ms = Ema(0.2)
        self._to_extend: list[tuple] = []  # (slot, features, tokens) its drafter reads after this step
        target = runner.target
        one_slot = target.new_cache(1, runner.cache.k.dtype)
        self._token_bytes = one_slot.nbytes + (runner.drafter.cache.nbytes // runner.drafter.cache.capacity
                                            if runner.drafter is not None else 0)
        self.steps = 0

    # ---- admission ---------------------------------------------------------------------------------------
    @property
    def kv_reserved(self) -> int:
        return sum(s.kv_bytes for s in self.active)

    def kv_needed(self, prompt_ids: list[int], config: DecodeConfig) -> int:
        """Bytes of KV cache (target and drafter) a request reserves: its prompt, answer and one step's tree."""
        return (len(prompt_ids) + config.max_new_tokens + config.tree_capacity()) * self._token_bytes

    def fits(self, prompt_ids: list[int], config: DecodeConfig) -> bool:
        """Room for this request now: a free slot and, under a KV budget, its bytes. A request larger than the
        whole budget never fits (`check` refuses it)."""
        if len(self.active) >= self.max_batch:
            return False
        return self.kv_budget is None or self.kv_reserved + self.kv_needed(prompt_ids, config) <= self.kv_budget

    def check(self, prompt_ids: list[int], config: DecodeConfig) -> None:
        """An InputError when the request can never run here (the engine's limits, or more KV than the budget)."""
        self.runner.check_prompt(prompt_ids, config)
        need = self.kv_needed(prompt_ids, config)
        if self.kv_budget is not None and need > self.kv_budget:
            raise InputError(f"the request needs {need / 2**20:.1f} MiB of KV cache, more than the server's budget "
                             f"of {self.kv_budget / 2**20:.1f} MiB; lower max_tokens or raise --kv-cache-memory")

    def admit(self, prompt_ids: list[int], config: DecodeConfig, on_tokens=None,
              cancelled: Callable[[], bool] | None = None, own_cache: bool = False) -> Slot | None:
        """Start a request (checked with `check` first) in the next step, or None while it does not fit.
        own_cache: decode in the runner's preallocated KV caches (its target's and its drafter's) instead of the
        request's own, for a loop that holds one request at a time (`Runner.generate`)."""
        if not self.fits(prompt_ids, config):
            return None
        runner = self.runner
        asked = config.mode == "eagle" and runner.drafter is not None
        # A greedy request joining a batch where drafting would not pay decodes plainly throughout: no drafter to
        # start, no features to keep, nothing to catch up (the budget's verdict at this width, runtime/budget.py).
        # (Alone, a request's budget decides step by step: it has no batch to slow down while its drafter waits.)
        drafting = asked and (self.budget is None or not Request.greedy_acceptance_of(config) or not self.active
                              or self.budget.admits_drafting(len(self.active) + 1))
        request = Request.new(prompt_ids, config, runner.eos_token_ids, drafting, on_tokens)
        if asked and not drafting:
            request.metrics.mode = "eagle"  # asked for: its tokens count as undrafted
        if own_cache:
            assert not any(s.request.cache is runner.cache for s in self.active), "the runner's caches are taken"
            request.cache, request.drafter = runner.cache, runner.drafter if drafting else None
        else:
            capacity = len(prompt_ids) + config.max_new_tokens + config.tree_capacity()
            request.cache = runner.target.new_cache(capacity, runner.cache.k.dtype, *kv_scales(runner.cache))
            request.drafter = runner.drafter.fresh(capacity) if drafting else None
        request.cache.length = 0
        slot = Slot(request, self.kv_needed(prompt_ids, config), drafting, self.clock(), cancelled)
        if self.budget is not None:
            self.budget.start(slot)
        self.active.append(slot)
        return slot

    # ---- one step ----------------------------------------------------------------------------------------
    def step(self) -> list[Slot]:
        """One shared forward over every active request; returns the requests that ended in it."""
        ended = [s for s in self.active if s.cancelled is not None and s.cancelled()]
        for s in ended:
            s.state = State.CANCELLED
            s.request.metrics.stop_reason = s.request.metrics.stop_reason or "stopped"
        live = [s for s in self.active if s not in ended]
        t_step, before = self.clock(), sum(len(s.request.output) for s in live)
        work = self._plan(live)
        if work:
            t_verify = self.clock()
            hidden, aux, greedy = self._forward(work)
            self._timed(work, self.clock() - t_verify)
            for w in work:
                self._resolve(w, hidden, aux, greedy, t_verify)
            self._extend_drafters()
            self.steps += 1
            if not any(w.kind == "prefill" for w in work):
                made = sum(len(s.request.output) for s in live) - before
                self.token_ms.add(1000 * (self.clock() - t_step) / max(made, 1))
        finished = [s for s in live if s.request.done]
        for s in finished:
            s.state = State.FINISHED
        ended += finished
        for s in ended:
            self._finish(s)
        self.active = [s for s in self.active if s not in ended]
        return ended

    def _timed(self, work: list[Work], seconds: float) -> None:
        """A pass's forward time: what a verify row costs (copy_gate.RowPrice) and the budget's learned curve. A
        prefill's time per row is no measure of either (a long prefill is compute-bound)."""
        if any(w.kind == "prefill" for w in work):
            return
        rows = sum(w.n for w in work)
        if any(w.kind == "tree" for w in work):
            self.runner.row_price.add_step(rows, 1000 * seconds)
        if self.budget is not None:
            self.budget.passed(rows, 1000 * seconds)

    def _plan(self, live: list[Slot]) -> list[Work]:
        budget = self.prefill_chunk if self.prefill_chunk is not None else sum(len(s.request.prompt_ids) for s in live)
        work, candidates = [], []
        for slot in live:
            request = slot.request
            if slot.prefilling:
                if budget <= 0:
                    continue  # waits for the next step's prefill rows
                chunk = min(len(request.prompt_ids) - slot.prefilled, budget)
                budget -= chunk
                ids = torch.tensor(request.prompt_ids[slot.prefilled:slot.prefilled + chunk])
                work.append(Work(slot, "prefill", Rows(ids, torch.arange(slot.prefilled, slot.prefilled + chunk),
                                                       request.cache)))
            elif not slot.drafting or self.room(request) < 1 or self._falling_back(slot):
                work.append(self._plain(slot))
            else:
                candidates.append(slot)
        return work + self._drafted(candidates, work)

    def _falling_back(self, slot: Slot) -> bool:
        """The drafter keeps missing: `fallback_tokens` plain steps (the runner's own rule, per request)."""
        request, cfg = slot.request, slot.request.config
        if slot.fallback_left == 0 and cfg.fallback_after and request.misses >= cfg.fallback_after:
            slot.fallback_left = cfg.fallback_tokens
            request.metrics.fallbacks += 1
            request.misses = 0
        return slot.fallback_left > 0

    def _plain(self, slot: Slot) -> Work:
        request = slot.request
        n = request.cache.length
        return Work(slot, "plain", Rows(torch.tensor([request.root]), torch.tensor([n]), request.cache))

    def _drafted(self, candidates: list[Slot], fixed: list[Work]) -> list[Work]:
        """The drafting requests' work: who drafts (greedy requests as the budget says; sampling ones always), their
        trees, cut to the step's best rate, then their copies."""
        if not candidates:
            return []
        fixed_rows = sum(x.n for x in fixed)
        decoding = sum(1 for x in fixed if x.kind == "plain") + len(candidates)
        plan = self._drafting_plan(candidates, fixed_rows, decoding)
        work = []
        for slot in candidates:
            if not plan[id(slot)]:
                slot.request.metrics.undrafted_tokens += 1
                work.append(self._plain(slot))
        drafting = [s for s in candidates if plan[id(s)]]
        if not drafting:
            return work
        t = self.clock()
        self._catch_up(drafting)
        trees = self._trees(drafting)
        share = (self.clock() - t) / len(trees)
        for w in trees:
            w.draft_s = share
        if self.budget is not None:
            self.budget.cut(trees, fixed_rows + len(work), decoding)
        # A token is worth what the loop's time buys per token, not what this request's share of a shared step
        # cost it: the copy gate prices copied rows with that (speculative/copy_gate.py).
        for w in trees:
            t = self.clock()
            request = w.slot.request
            if request.gate is not None and self.token_ms.value:
                request.gate.prices(self.runner.row_price.row_ms, self.token_ms.value)
            self.draft(request, self.room(request), slice(1, None), w.draft)
            tree = w.draft.tree()
            w.rows = Rows(tree.tokens, tree.positions(request.cache.length), request.cache, tree.mask)
            w.draft_s += self.clock() - t
        return work + trees

    def _drafting_plan(self, candidates: list[Slot], fixed_rows: int, decoding: int) -> dict[int, bool]:
        """id(slot) -> whether it drafts this step: greedy requests as the budget says; sampling requests always
        (their draws must not depend on the batch). Where the budget learns its curve and has not timed a one-row
        pass yet, one greedy request decodes plainly to time it."""
        plan = {id(s): True for s in candidates}
        greedy = [s for s in candidates if s.request.greedy_acceptance]
        if self.budget is None or not greedy:
            return plan
        if self.budget.measuring():
            plan[id(greedy[0])] = False
            return plan
        for s, drafts in zip(greedy, self.budget.drafters(greedy, fixed_rows, decoding)):
            plan[id(s)] = drafts
        return plan

    def _trees(self, slots: list[Slot]) -> list[Work]:
        """Each slot's drafted tree (its first proposer's): dynamic trees of EAGLE-3 drafters grown together, level
        by level in shared head forwards; any other alone."""
        runner = self.runner
        together = [s for s in slots if s.request.config.tree == "dynamic"]
        if len(together) < 2 or not batchable([s.request.drafter for s in together]):
            together = []  # one tree grows through its proposer, as any tree of another shape
        drafts = {}
        if together:
            shapes = []
            for s in together:
                cfg = s.request.config
                shapes.append((cfg.beam_width, min(cfg.draft_length, self.room(s.request)),
                               min_score_of(cfg.confidence_threshold)))
            cands = grow_together([s.request.drafter for s in together], shapes)
            for s, cand in zip(together, cands):
                draft = self.new_draft(s.request)
                cfg = s.request.config
                draft.set_tree(DRAFTER, s.request.drafter.tree_of(s.request.root, cand, cfg.total_tokens,
                                                                  min_score_of(cfg.confidence_threshold)))
                drafts[id(s)] = draft
        out = []
        for s in slots:
            draft = drafts.get(id(s)) or self.draft(s.request, self.room(s.request), slice(0, 1))
            out.append(Work(s, "tree", None, draft))  # its rows once the copies are grafted
        return out

    def _catch_up(self, slots: list[Slot]) -> None:
        """The drafters read the plain steps they missed (their features and the tokens after them)."""
        behind = [s for s in slots if s.behind_tokens]
        if not behind:
            return
        auxes = [torch.cat(s.behind_aux) if s.request.drafter.needs_features else None for s in behind]
        self._extend([s.request.drafter for s in behind], auxes, [torch.tensor(s.behind_tokens) for s in behind])
        for s in behind:
            s.behind_aux, s.behind_tokens = [], []

    @staticmethod
    def _extend(drafters: list, auxes: list, tokens: list) -> None:
        """Each drafter reads its features and tokens: in one head forward where they share a head."""
        if len(drafters) > 1 and batchable(drafters):
            extend_together(drafters, auxes, tokens)
            return
        for d, aux, t in zip(drafters, auxes, tokens):
            d.extend(aux, t)

    # ---- the shared forward ------------------------------------------------------------------------------
    def _forward(self, work: list[Work]):
        """One target forward over every work item's rows; the greedy tokens of the rows greedy requests read,
        through the LM head in one call."""
        runner = self.runner
        row = 0
        for w in work:
            w.first_row, row = row, row + w.n
        need_aux = any(w.slot.drafting and w.slot.request.drafter.needs_features for w in work)
        hidden, aux = runner.target.batched_hidden_states([w.rows for w in work], need_aux=need_aux,
                                                          aux_layers=runner.aux_layers)
        wanted = []
        for w in work:
            if w.kind == "tree" and w.slot.request.greedy_acceptance:
                scored = scored_rows(w.n, w.draft.tree().parents, runner.target.lm_head_rows)
                wanted += (range(w.first_row, w.first_row + w.n) if scored is None
                           else (scored + w.first_row).tolist())
            elif w.slot.request.greedy and (w.kind == "plain" or w.slot.prefilled + w.n == len(
                    w.slot.request.prompt_ids)):
                wanted.append(w.first_row + w.n - 1)
        greedy = torch.full((hidden.shape[0],), -1, dtype=torch.long)  # -1: a row no greedy request reads
        if wanted:
            idx = torch.tensor(wanted)
            greedy[idx] = runner.target.greedy(hidden[idx])
        return hidden, aux, greedy

    def _next_token(self, w: Work, hidden: torch.Tensor, greedy: torch.Tensor) -> int:
        """The token after a prefill's or a plain step's last row: the greedy pick, or the request's own draw."""
        last = w.first_row + w.n - 1
        if greedy[last] >= 0:
            return int(greedy[last])
        logits = self.runner.target.logits(hidden[last:last + 1])
        return w.slot.request.pick(logits[-1], self.runner.target.argmax)

    # ---- each request on its own ---------------------------------------------------------------------------
    def _resolve(self, w: Work, hidden, aux, greedy: torch.Tensor, t_verify: float) -> None:
        rows = slice(w.first_row, w.first_row + w.n)
        if w.kind == "prefill":
            self._prefilled(w, hidden, aux[rows] if aux is not None else None, greedy)
        elif w.kind == "plain":
            self._plain_done(w, hidden, aux[rows] if aux is not None else None, greedy, t_verify)
        else:
            self._tree_done(w, hidden[rows], aux[rows] if aux is not None else None, greedy, t_verify)

    def _prefilled(self, w: Work, hidden, aux, greedy: torch.Tensor) -> None:
        slot, request = w.slot, w.slot.request
        slot.prefilled += w.n
        request.cache.length = slot.prefilled
        if slot.drafting:
            slot.prompt_aux.append(aux)
        if slot.prefilled < len(request.prompt_ids):
            return
        slot.state = State.DECODING
        root = self._next_token(w, hidden, greedy)
        request.metrics.prefill_s = self.clock() - slot.admitted
        request.root = root
        request.commit([root])
        if slot.drafting and not request.done:
            feats = torch.cat(slot.prompt_aux) if request.drafter.needs_features else None
            slot.prompt_aux = []
            self._start_drafting(request, feats, root)

    def _plain_done(self, w: Work, hidden, aux, greedy: torch.Tensor, t_verify: float) -> None:
        slot, request = w.slot, w.slot.request
        out_of_room = slot.drafting and self.room(request) < 1  # why this drafting request went plain
        nxt = self._next_token(w, hidden, greedy)
        request.cache.length += 1
        if not slot.drafting and request.metrics.mode == "eagle":
            request.metrics.undrafted_tokens += 1
        elif not slot.drafting:
            request.metrics.steps.append(StepRecord(0, 0, 0, 0.0, self.clock() - t_verify))
        elif slot.fallback_left > 0:
            slot.fallback_left -= 1
            request.metrics.fallback_tokens += 1
        request.commit([nxt])
        request.root = nxt
        if slot.drafting and not request.done:
            if out_of_room:  # the root's own forward gave the last token the context holds
                request.metrics.stop_reason = "context"
                return
            if aux is not None:
                slot.behind_aux.append(aux)
            slot.behind_tokens.append(nxt)

    def _tree_done(self, w: Work, hidden, aux, greedy: torch.Tensor, t_verify: float) -> None:
        slot, request, runner = w.slot, w.slot.request, self.runner
        # The drafter's start on the prompt is spent whether or not the request drafts: no step's cost.
        t, carry = self.clock(), (0.0 if len(request.metrics.steps) == 0 else request.carry_draft_s)
        target_next = None
        if request.greedy_acceptance:
            target_next = greedy[w.first_row:w.first_row + w.n]
        verified = Verified(hidden, aux)
        accepted = accept(runner.target, request, w.draft, verified, target_next)
        feed = commit(request, w.draft, verified, accepted, w.draft_s, self.clock() - t_verify)
        if self.budget is not None and slot.history is not None:
            self.budget.observe(w, accepted.nodes, carry + w.draft_s + self.clock() - t,
                                planned=self.budget.planned)
        if feed is not None:
            self._to_extend.append((slot, *feed))

    def _extend_drafters(self) -> None:
        """This step's drafted requests' drafters read their accepted paths, together; each is charged its share."""
        feeds, self._to_extend = self._to_extend, []
        if not feeds:
            return
        t = self.clock()
        self._extend([s.request.drafter for s, _, _ in feeds], [a for _, a, _ in feeds], [t_ for _, _, t_ in feeds])
        spent = self.clock() - t
        for slot, _, _ in feeds:
            slot.request.carry_draft_s = spent / len(feeds)

    # ---- a request's drafting ----------------------------------------------------------------------------
    def _start_drafting(self, request: Request, aux: torch.Tensor | None, root: int) -> None:
        """After the prompt's prefill chose `root`: the request's drafter reads the prompt (and its features), and
        its proposers are made."""
        t = self.clock()
        request.drafter.start(torch.tensor(request.prompt_ids), aux, root)
        request.root, request.carry_draft_s = root, self.clock() - t
        request.proposers = request_proposers(request.drafter, self.runner.datastore, request)

    def room(self, request: Request) -> int:
        """How deep this step's tree may go: the deepest node sits at position n + depth, so no node (drafted or
        copied) goes deeper than the tokens still to emit, nor past the model's last position."""
        return min(request.left, self.runner.max_positions - 1 - request.cache.length)

    def draft(self, request: Request, room: int, proposers: slice = slice(None),
              draft: DraftTree | None = None) -> DraftTree:
        """The request's proposers' guesses for this step (those in `proposers`, added to `draft`), in one tree below
        the root, no deeper than `room`."""
        if draft is None:
            draft = self.new_draft(request)
        for proposer in request.proposers[proposers]:
            proposer.propose(draft, request, room)
        return draft

    def new_draft(self, request: Request) -> DraftTree:
        """This step's empty tree below the request's root (the copy gate priced for it first)."""
        if request.gate is not None:
            request.gate.prices(self.runner.row_price.row_ms, request.token_ms)
        return DraftTree.rooted(request.root)

    def _finish(self, slot: Slot) -> None:
        m = slot.request.metrics
        m.total_s = self.clock() - slot.admitted
        m.generated_tokens = len(slot.request.output)

