"""The decode loop: prefill, then one step after another until a stop. One step, top to bottom (`Runner._step`):

    draft   the proposers build one tree below the root      -> DraftTree (runtime/proposers.py)
    verify  one target forward over root + tree               -> Verified (hidden states, features)
    accept  the longest path the target agrees with          -> Accepted (path, bonus)
    commit  keep the path's K/V, emit its tokens, catch the drafter up, record the step (StepRecord)

    runner = Runner(target, head, capacity=4096)                  # an EAGLE-3 head drafts
    runner = Runner(target, None, capacity=4096, drafter=drafter)  # or any drafter, e.g. a small LM (model_drafter.py)
    result = runner.generate(prompt_ids, DecodeConfig(max_new_tokens=64))
    result.token_ids, result.metrics.acceptance_length

The runner holds what requests share (models, KV caches, the verify-row price); each generation's own state is a
`Request` (runtime/request.py). Greedy acceptance makes the output token-identical to plain greedy decoding
(`mode="ar"`): every committed token is the target's own argmax given the tokens before it; the draft only decides
how many of them one target forward can confirm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.errors import InputError
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.drafter import Drafter
from eagle_trt.runtime.metrics import GenerationMetrics, StepRecord
from eagle_trt.runtime.proposers import CONTEXT, DATASTORE, DRAFTER, DraftTree, request_proposers
from eagle_trt.runtime.request import Request
from eagle_trt.runtime.tree_drafter import TreeDrafter
from eagle_trt.speculative.copy_gate import RowPrice
from eagle_trt.speculative.datastore import Datastore
from eagle_trt.speculative.sampling import processed_probs
from eagle_trt.speculative.tree import Tree
from eagle_trt.speculative.verify import verify_greedy, verify_sampling
from eagle_trt.timing import Clock, clock_or_default


@dataclass
class GenerationResult:
    token_ids: list[int]
    metrics: GenerationMetrics
    prompt_ids: list[int] = field(default_factory=list)


@dataclass
class Verified:
    """The target's forward over one step's tree: hidden states [N, H] and, for a drafter that reads them, the
    features [N, F] (None otherwise)."""

    hidden: torch.Tensor
    aux: torch.Tensor | None


@dataclass
class Accepted:
    """What verification kept: the path (node indices, root first; also as a list), the bonus token after it, and the
    accepted draft tokens (the path's tokens after the root)."""

    path: torch.Tensor
    nodes: list[int]
    bonus: int
    tokens: list[int]


class Runner:
    def __init__(self, target: LlamaTarget, head: Eagle3DraftHead | None, capacity: int,
                 kv_dtype: torch.dtype | None = None, k_scales=None, v_scales=None, max_input_len: int | None = None,
                 draft_k_scales=None, draft_v_scales=None, datastore: Datastore | None = None,
                 eos_token_ids: list[int] | None = None, tree_room: int | None = None,
                 drafter: TreeDrafter | None = None, clock: Clock | None = None):
        """`head`: an EAGLE-3 head, drafted with by `Drafter`; or `drafter`: any other (runtime/tree_drafter.py).
        `clock`: where every timing the decode policies read comes from (eagle_trt/timing.py); the wall clock by
        default, a `TickClock` where a test needs the same decisions under any load."""
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
        if drafter is not None:  # a draft model's own RoPE range may be shorter than the target's
            self.max_positions = min(self.max_positions, drafter.max_positions)

    # ---- public ----------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], config: DecodeConfig,
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        self.check_prompt(prompt_ids, config)
        drafting = config.mode == "eagle" and self.drafter is not None
        request = Request.new(prompt_ids, config, self.eos_token_ids, drafting, on_tokens)
        request.cache, request.drafter = self.cache, self.drafter  # one request at a time: the runner's own
        t0 = self.clock()
        if drafting:
            self._generate_eagle(request)
        else:
            self._generate_ar(request)
        request.metrics.total_s = self.clock() - t0
        request.metrics.generated_tokens = len(request.output)
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

    # ---- the target -----------------------------------------------------------------------------------
    def _next_after(self, request: Request, ids: torch.Tensor, positions: torch.Tensor,
                    need_aux: bool) -> tuple[int, torch.Tensor | None]:
        """One target forward over ids; the token after the last one (greedy: the LM head's argmax, fused where the
        target has that kernel) and the features, if asked."""
        last = torch.tensor([ids.numel() - 1]) if ids.numel() > 1 else None  # one token: its only row
        if request.greedy:
            hidden, aux = self.target.hidden_states(ids, positions, request.cache, need_aux=need_aux, rows=last,
                                                    aux_layers=self.aux_layers)
            return int(self.target.greedy(hidden)[0]), aux
        logits, aux = self.target.forward(ids, positions, request.cache, need_aux=need_aux, logits_rows=last,
                                          aux_layers=self.aux_layers)
        return request.pick(logits[-1], self.target.argmax), aux

    def _prefill(self, request: Request, need_aux: bool) -> tuple[int, torch.Tensor | None]:
        ids = torch.tensor(request.prompt_ids)
        t = self.clock()
        request.cache.length = 0
        tok, aux = self._next_after(request, ids, torch.arange(ids.numel()), need_aux)
        request.cache.length = ids.numel()
        request.metrics.prefill_s = self.clock() - t
        return tok, aux

    def _plain_step(self, request: Request, tok: int, need_aux: bool) -> tuple[int, torch.Tensor | None]:
        n = request.cache.length
        nxt, aux = self._next_after(request, torch.tensor([tok]), torch.tensor([n]), need_aux)
        request.cache.length = n + 1
        return nxt, aux

    # ---- loops ------------------------------------------------------------------------------------
    def _generate_ar(self, request: Request) -> None:
        tok, _ = self._prefill(request, need_aux=False)
        request.commit([tok])
        while not request.done:
            t = self.clock()
            tok, _ = self._plain_step(request, tok, need_aux=False)
            request.metrics.steps.append(StepRecord(0, 0, 0, 0.0, self.clock() - t))
            request.commit([tok])

    def _generate_eagle(self, request: Request) -> None:
        root, aux = self._prefill(request, need_aux=self.drafter.needs_features)
        request.commit([root])
        if request.done:
            return
        self.start_drafting(request, aux, root)
        cfg = request.config
        while not request.done:
            if cfg.fallback_after and request.misses >= cfg.fallback_after:
                self._fallback(request)
                if request.done:
                    return
            # The deepest node sits at position n + depth: no node (drafted or copied) goes deeper than the tokens
            # still to emit, nor past the model's last position.
            room = self.room(request)
            if room < 1:  # the root's own forward gives the last token
                nxt, _ = self._plain_step(request, request.root, need_aux=False)
                request.commit([nxt])
                if not request.done:
                    request.metrics.stop_reason = "context"
                return
            self._step(request, room)

    def start_drafting(self, request: Request, aux: torch.Tensor | None, root: int) -> None:
        """After the prompt's prefill chose `root`: the request's drafter reads the prompt (and its features), and
        its proposers are made."""
        t = self.clock()
        request.drafter.start(torch.tensor(request.prompt_ids), aux, root)
        request.root, request.carry_draft_s = root, self.clock() - t
        request.proposers = request_proposers(request.drafter, self.datastore, request)

    def room(self, request: Request) -> int:
        """How deep this step's tree may go: the deepest node sits at position n + depth, so no node (drafted or
        copied) goes deeper than the tokens still to emit, nor past the model's last position."""
        return min(request.left, self.max_positions - 1 - request.cache.length)

    def _step(self, request: Request, room: int) -> None:
        """One speculative step: draft -> verify -> accept -> commit."""
        t_draft = self.clock()
        draft = self.draft(request, room)
        t_verify = self.clock()
        verified = self._verify(request, draft)
        accepted = self.accept(request, draft, verified)
        self.commit_step(request, draft, verified, accepted, t_verify - t_draft, t_verify)
        self.row_price.add_step(draft.size, 1000 * request.metrics.steps[-1].verify_s)

    def commit_step(self, request: Request, draft: DraftTree, verified: Verified, accepted: Accepted,
                    draft_s: float, t_verify: float, extend: bool = True) -> tuple | None:
        """Keep the accepted path's K/V, emit its tokens, record the step, and catch the drafter up. `t_verify`: when
        the verify pass began (a batched pass's, shared by every request in it). extend=False: return what the
        drafter should read (the path's features, its tokens and the bonus) instead of feeding it, for a caller
        that feeds several drafters at once (runtime/batch_drafting.py); None when the request is over."""
        n = request.cache.length
        # Keep the accepted path's K/V, packed right after the prefix; the rest is dead space.
        request.cache.compact(n, accepted.path)
        request.cache.length = n + accepted.path.numel()
        t_done = self.clock()
        kept = request.commit(accepted.tokens + [accepted.bonus])
        request.metrics.steps.append(_record(draft, accepted, kept, request.carry_draft_s + draft_s,
                                             t_done - t_verify))
        request.misses = request.misses + 1 if not accepted.tokens else 0
        if request.done:
            return None
        request.committed_tokens += len(accepted.tokens) + 1
        request.committed_s += request.carry_draft_s + draft_s + t_done - t_verify
        if request.gate is not None:
            request.gate.stepped(draft.accepted_from(accepted.nodes[1:], DRAFTER), request.index.tokens)
        request.root = accepted.bonus
        aux = verified.aux[accepted.path] if verified.aux is not None else None
        if not extend:
            return aux, torch.tensor(accepted.tokens + [accepted.bonus])
        t = self.clock()
        request.drafter.extend(aux, torch.tensor(accepted.tokens + [accepted.bonus]))
        request.carry_draft_s = self.clock() - t
        return None

    def draft(self, request: Request, room: int, proposers: slice = slice(None),
              draft: DraftTree | None = None) -> DraftTree:
        """Every proposer's guesses for this step (or those in `proposers`, added to `draft`), in one tree below the
        root, no deeper than `room`."""
        if draft is None:
            draft = self.new_draft(request)
        for proposer in request.proposers[proposers]:
            proposer.propose(draft, request, room)
        return draft

    def new_draft(self, request: Request) -> DraftTree:
        """This step's empty tree below the request's root (the copy gate priced for it first)."""
        if request.gate is not None:
            request.gate.prices(self.row_price.row_ms, request.token_ms)
        return DraftTree.rooted(request.root)

    def _verify(self, request: Request, draft: DraftTree) -> Verified:
        """One target forward over root + tree; node i sits at position n + depth(i) and sees its ancestors."""
        tree = draft.tree()
        hidden, aux = self.target.hidden_states(tree.tokens, tree.positions(request.cache.length), request.cache,
                                                tree.mask, need_aux=request.drafter.needs_features,
                                                aux_layers=self.aux_layers)
        return Verified(hidden, aux)

    def _fallback(self, request: Request) -> None:
        """The drafter keeps missing: decode `fallback_tokens` plainly (same target, same p: still lossless), then
        catch the drafter up on them in one batch."""
        metrics, need_aux = request.metrics, request.drafter.needs_features
        metrics.fallbacks += 1
        feats, nexts = [], []
        for _ in range(request.config.fallback_tokens):
            nxt, feat = self._plain_step(request, request.root, need_aux=need_aux)
            feats.append(feat)
            nexts.append(nxt)
            metrics.fallback_tokens += 1
            request.commit([nxt])
            if request.done:
                return
            request.root = nxt
        t = self.clock()
        request.drafter.extend(torch.cat(feats) if need_aux else None, torch.tensor(nexts))
        request.carry_draft_s = self.clock() - t
        request.misses = 0

    def accept(self, request: Request, draft: DraftTree, verified: Verified,
               target_next: torch.Tensor | None = None) -> Accepted:
        """Greedy: the longest path the target's argmax agrees with (`target_next`: the argmax after each node, when
        the caller scored them already; -1 where not); at T > 0 (or with typical acceptance), multi-branch
        rejection sampling."""
        tree, hidden, cfg = draft.tree(), verified.hidden, request.config
        if request.greedy_acceptance:
            if target_next is None:
                target_next = self._greedy_next(tree, hidden)
            path, bonus = verify_greedy(tree, target_next)
            if bonus < 0:
                bonus = int(self.target.greedy(hidden[path[-1:]])[0])
        else:
            logits = self.target.logits(hidden)
            p = (processed_probs(logits, request.sampling) if not request.greedy
                 else torch.softmax(logits.float(), -1))
            outcome = verify_sampling(tree, p, request.generator, cfg.posterior_threshold, cfg.posterior_alpha,
                                      draft.proposals)
            request.metrics.rejections += outcome.rejections
            path, bonus = outcome.path, outcome.bonus
        return Accepted(path, path.tolist(), bonus, tree.tokens[path[1:]].tolist())

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


def _record(draft: DraftTree, accepted: Accepted, kept: int, draft_s: float, verify_s: float) -> StepRecord:
    """A verify step's metrics. `kept`: the tokens it committed (accepted + bonus, fewer when a stop fell inside
    them): tau counts only those, and the copies' share is capped by them."""
    n_accepted = max(kept - 1, 0)
    lookup = min(draft.accepted_from(accepted.nodes, CONTEXT, DATASTORE), n_accepted)
    return StepRecord(n_accepted, draft.size - 1, draft.tree().depth, draft_s, verify_s,
                      lookup_accepted=lookup, lookup_size=draft.size_of(CONTEXT, DATASTORE),
                      datastore_accepted=min(draft.accepted_from(accepted.nodes, DATASTORE), lookup),
                      datastore_size=draft.size_of(DATASTORE))
