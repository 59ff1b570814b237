"""Proposers: whatever guesses the next tokens for one verify pass, merged into one tree.

    draft = DraftTree.rooted(root)
    for proposer in request_proposers:            # the drafter first, then the copy sources
        proposer.propose(draft, request, room)
    tree = draft.tree()                            # one Tree; draft.spans say whose nodes are whose

Four proposers: `DrafterProposer` (the EAGLE-3 head or a draft model growing a dynamic/static tree or a chain,
runtime/tree_drafter.py), `ContextCopies` (prompt lookup: what followed an earlier occurrence of the last tokens),
`DatastoreCopies` (the same over the draft's datastore). Each appends its nodes after the ones before it, so its
nodes are one contiguous span of node indices; the step record counts acceptance per span.

A copy source's chains go through the same three cuts in order: the request's copy gate (greedy only: cut where a
chain stops paying for its rows, speculative/copy_gate.py), the verify-row cap (`max_verify_rows`, shared by all
copy sources, earlier sources first: `within_rows`), then the graft onto the tree (sharing any prefix it has).
Lossless whatever they propose: verification keeps only tokens the target itself gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from eagle_trt.config.decode import DEFAULT_STATIC_TREE, DecodeConfig
from eagle_trt.runtime.request import Request
from eagle_trt.runtime.tree_drafter import TreeDrafter
from eagle_trt.speculative.datastore import Datastore
from eagle_trt.speculative.lookup import copy_budget, graft, shared_prefix, within_rows
from eagle_trt.speculative.tree import StaticLayout, Tree, chain_choices, static_layout, tree_from_parents, trim_choices

DRAFTER, CONTEXT, DATASTORE = "drafter", "context", "datastore"


@dataclass(frozen=True)
class Span:
    """Node indices [start, stop) of a step's tree that one proposer added."""

    source: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass
class DraftTree:
    """A step's tree while the proposers build it: node 0 is the root; every parent before its children. Held as a
    `Tree`, or as token/parent lists once a copy is grafted (the lists are made only then: with lookup off a step
    converts nothing)."""

    _tree: Tree | None = None
    _tokens: list[int] | None = None
    _parents: list[int] | None = None
    spans: list[Span] = field(default_factory=list)
    # q [V] per node drawn at random from the drafter's own distribution (verified by min(1, p/q)); None: every
    # node is a deterministic pick, a point mass to the verifier.
    proposals: dict[int, torch.Tensor] | None = None
    drafted: Tree | None = None  # the first proposer's tree as it set it (cut by keep_best), scores included
    copies: list[list[int]] = field(default_factory=list)  # copy chains grafted so far, after their cuts
    offered: list[list[int]] = field(default_factory=list)  # copy chains proposed so far, before any cut

    @classmethod
    def rooted(cls, root: int) -> DraftTree:
        return cls(_tokens=[root], _parents=[-1])

    @property
    def tokens(self) -> list[int]:
        return self._lists()[0]

    @property
    def parents(self) -> list[int]:
        return self._lists()[1]

    def _lists(self) -> tuple[list[int], list[int]]:
        if self._tokens is None:
            self._tokens, self._parents = self._tree.tokens.tolist(), self._tree.parents.tolist()
        return self._tokens, self._parents

    @property
    def root(self) -> int:
        return self._tokens[0] if self._tokens is not None else int(self._tree.tokens[0])

    @property
    def size(self) -> int:
        """Nodes, root included: the verify pass's rows."""
        return len(self._tokens) if self._tokens is not None else self._tree.tokens.numel()

    def span(self, source: str) -> Span | None:
        return next((s for s in self.spans if s.source == source), None)

    def set_tree(self, source: str, tree: Tree, proposals: dict[int, torch.Tensor] | None = None) -> None:
        """The first proposer's nodes: a whole tree below the root."""
        assert self.size == 1, "a drafted tree comes first"
        self._tree, self._tokens, self._parents, self.proposals = tree, None, None, proposals
        self.drafted = tree
        self.spans.append(Span(source, 1, self.size))

    def keep_best(self, n: int, values: list[float] | None = None) -> None:
        """Cut the drafted tree (the only proposer so far, with scored nodes) to its `n` best nodes below the root:
        the highest `values` (one per node below the root; by default the cumulative log-probs), ties to the earlier
        node. A node's value must not exceed its parent's, so the kept set is closed under ancestors."""
        tree = self._tree
        assert tree is not None and tree.scores is not None and len(self.spans) == 1, "a scored drafted tree only"
        scores = tree.scores
        if n >= len(scores) - 1:
            return
        rank = scores if values is None else [0.0] + list(values)
        kept = sorted(sorted(range(1, len(scores)), key=lambda j: (-rank[j], j))[:n])
        index = {0: 0, **{j: i for i, j in enumerate(kept, start=1)}}
        parents = tree.parents.tolist()
        cut = tree_from_parents(tree.tokens[[0] + kept], [-1] + [index[parents[j]] for j in kept])
        cut.scores = [0.0] + [scores[j] for j in kept]
        self._tree, self._tokens, self._parents = cut, None, None
        self.drafted = cut
        self.spans = [Span(self.spans[0].source, 1, self.size)]

    def graft(self, source: str, chains: list[list[int]]) -> None:
        """Each chain as one more path below the root, sharing what the tree already has."""
        start = self.size
        tokens, parents = self._lists()
        for chain in chains:
            tokens, parents, added = graft(tokens, parents, chain)
            if added:
                self._tree = None
        self._tokens, self._parents = tokens, parents
        self.copies += chains
        self.spans.append(Span(source, start, self.size))

    def tree(self) -> Tree:
        if self._tree is None:
            self._tree = tree_from_parents(torch.tensor(self._tokens), torch.tensor(self._parents))
        return self._tree

    def accepted_from(self, path: list[int], *sources: str) -> int:
        """Nodes of the accepted path (node indices) that the given proposers added."""
        spans = [s for s in self.spans if s.source in sources]
        return sum(1 for node in path for s in spans if s.start <= node < s.stop)

    def size_of(self, *sources: str) -> int:
        return sum(s.size for s in self.spans if s.source in sources)


class Proposer(Protocol):
    source: str

    def propose(self, draft: DraftTree, request: Request, room: int) -> None:
        """Add this proposer's guesses to `draft`, no deeper than `room` tokens below the root."""


class DrafterProposer:
    """The drafter's tree (an EAGLE-3 head or a draft model, runtime/tree_drafter.py) in the request's shape."""

    source = DRAFTER

    def __init__(self, drafter: TreeDrafter, config: DecodeConfig):
        self.drafter, self.config = drafter, config
        self.layouts = None
        if config.tree != "dynamic":
            choices = chain_choices(config.draft_length) if config.tree == "chain" else (
                config.static_tree or trim_choices(DEFAULT_STATIC_TREE, config.draft_length, config.total_tokens))
            self.layouts = StaticLayouts(choices)

    def propose(self, draft: DraftTree, request: Request, room: int) -> None:
        """At T > 0 a drafter that samples draws a chain from its own q (verified by min(1, p/q)); otherwise the
        tree is its top-k picks, point masses to the verifier."""
        cfg, drafter, root = self.config, self.drafter, draft.root
        depth = min(cfg.draft_length, room)
        if cfg.tree == "chain" and not request.greedy and cfg.posterior_threshold is None and drafter.samples_chains:
            tree, proposals = drafter.draft_sampled_chain(root, depth, request.sampling, request.generator)
            draft.set_tree(self.source, tree, proposals)
        elif self.layouts is None:
            draft.set_tree(self.source, drafter.draft_dynamic(root, cfg.beam_width, depth, cfg.total_tokens,
                                                              cfg.confidence_threshold))
        else:
            draft.set_tree(self.source, drafter.draft_static(root, self.layouts.within(room)))


class _Copies:
    """What both copy sources share: the gate's cut, the row cap, the graft."""

    source: str
    rank: int  # the copy gate's source index

    def __init__(self, config: DecodeConfig):
        self.config = config

    def chains(self, draft: DraftTree, request: Request, tokens: int) -> list[list[int]]:
        raise NotImplementedError

    def propose(self, draft: DraftTree, request: Request, room: int) -> None:
        chains = self.chains(draft, request, min(self.config.lookup_tokens, room))
        draft.offered += chains
        drafted = draft.span(DRAFTER).stop  # the drafter's nodes come first: 0 .. drafted - 1
        if request.gate is not None:
            # Leading tokens a chain shares with the drafter's own tree take no row of their own.
            tokens, parents = draft.tokens[:drafted], draft.parents[:drafted]
            shared = [shared_prefix(tokens, parents, c) for c in chains]
            chains = [c for c in request.gate.cut(chains, self.rank, len(request.index.tokens), shared) if c]
        budget = copy_budget(self.config.max_verify_rows, drafted)
        draft.graft(self.source, within_rows(draft.copies, chains, budget)[1])


class ContextCopies(_Copies):
    """Prompt lookup over the request's own prompt and output (its n-gram index)."""

    source, rank = CONTEXT, 0

    def chains(self, draft: DraftTree, request: Request, tokens: int) -> list[list[int]]:
        return request.index.proposals(tokens, self.config.lookup_branches)


class DatastoreCopies(_Copies):
    """The most frequent continuations of the last tokens in the draft's datastore (speculative/datastore.py),
    those the context did not already offer."""

    source, rank = DATASTORE, 1

    def __init__(self, config: DecodeConfig, datastore: Datastore):
        super().__init__(config)
        self.datastore = datastore

    def chains(self, draft: DraftTree, request: Request, tokens: int) -> list[list[int]]:
        offered, branches = draft.offered, self.config.datastore_branches
        history = request.index.tokens
        extra = self.datastore.proposals(history[-max(self.datastore.ngrams):], tokens, branches + len(offered))
        return [c for c in extra if c not in offered][:branches]


def grafted(tree: Tree, context: list[list[int]], datastore: list[list[int]] = ()) -> DraftTree:
    """A drafted tree with copies grafted, uncut: what a step verifies (tune times it)."""
    draft = DraftTree.rooted(int(tree.tokens[0]))
    draft.set_tree(DRAFTER, tree)
    draft.graft(CONTEXT, context)
    draft.graft(DATASTORE, list(datastore))
    draft.tree()
    return draft


def request_proposers(drafter: TreeDrafter, datastore: Datastore | None, request: Request) -> list[Proposer]:
    """What proposes for this request: the drafter, then the context's copies, then the datastore's."""
    cfg = request.config
    out: list[Proposer] = [DrafterProposer(drafter, cfg)]
    if request.index is not None:
        out.append(ContextCopies(cfg))
        if datastore is not None and cfg.datastore_branches > 0:
            out.append(DatastoreCopies(cfg, datastore))
    return out


class StaticLayouts:
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
