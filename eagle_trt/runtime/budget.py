"""The decode loop's budget (runtime/loop.py): the step budget's pure rules (speculative/step_budget.py) fed with what
the loop measures. One budget per runner for `run` (its requests come one after another, so what one learns the next
starts from) and one per server loop.

    budget = LoopBudget(cost)                  # a measured verify-cost curve, or None: learned from the passes
    drafts = budget.drafters(candidates, fixed_rows, decoding)      # which greedy requests draft
    budget.cut(trees, fixed_rows, decoding)    # each drafted tree cut to the step's best rate
    budget.observe(work, accepted_path, ms, planned)              # after a drafted request committed
    budget.passed(rows, ms)                    # every decoding pass's forward time

What it measures, per request (kept on its `Slot`) and over all requests: the accepted draft tokens, drafting time
and drafted rows of the drafted steps (`DraftHistory`), and how often the drafter's path probabilities come true at
each depth (`DepthCalibration`).
"""

from __future__ import annotations

from eagle_trt.runtime.batch_slot import Slot, Work
from eagle_trt.runtime.proposers import DRAFTER, DraftTree
from eagle_trt.speculative.step_budget import (CostCurve, DepthCalibration, DraftHistory, OnlineCost, StepShape,
                                               choose_drafters, cut_trees, expected_by_depth, node_values, path_probs)


class LoopBudget:
    REQUEST_PRIOR = 4.0  # steps' worth of weight the server's calibration has in a request's
    EXPLORE = 16

    def __init__(self, cost: CostCurve | None = None, learn: bool = True):
        """learn=False: a measured curve stays the one read (a test's synthetic curve on a counted clock)."""
        self.measured, self.learn = cost, learn or cost is None
        self.online = OnlineCost()
        self.history = DraftHistory()  # every request's drafted steps
        self.calibration = DepthCalibration()
        self.planned = False  # whether this step's trees were cut on a cost curve
        self.plain_admissions = 0  # requests admitted without a drafter since the last one with

    def start(self, slot: Slot) -> None:
        """A request's own measures, each shrinking to the server's until it has its own."""
        slot.history = DraftHistory()
        slot.calibration = DepthCalibration(self.calibration, self.REQUEST_PRIOR)

    @property
    def cost(self):
        """The verify-cost curve the budget reads: the one learned from this loop's own passes once it has two row
        counts (they carry what a curve timed on one request at start-up misses: the batch's make-up, the load
        since), the one measured up front until then."""
        return self.online if self.learn and self.online.ready else self.measured

    def measuring(self) -> bool:
        """Whether the next decoding pass should be a plain one: a learned curve needs a one-row pass to start."""
        return self.measured is None and 1 not in self.online.points

    def passed(self, rows: int, ms: float) -> None:
        self.online.add(rows, ms)

    def admits_drafting(self, width: int) -> bool:
        """Whether a greedy request joining a batch of `width` requests (itself included) should keep a drafter: the
        gain all requests' outlook gives one drafting request beside plain ones on this step's shape. True while
        nothing is measured."""
        cost, outlook = self.cost, self.history.outlook()
        if cost is None or outlook is None:
            return True
        if choose_drafters([outlook], StepShape(tokens=width, rows=width), cost)[0] > 1:
            self.plain_admissions = 0
            return True
        # Every EXPLORE-th request still drafts, so the outlook the verdict reads stays measured.
        self.plain_admissions += 1
        if self.plain_admissions < self.EXPLORE:
            return False
        self.plain_admissions = 0
        return True

    # ---- before drafting -----------------------------------------------------------------------------------
    def drafters(self, slots: list[Slot], fixed_rows: int, decoding: int) -> list[bool]:
        """Whether each of these greedy requests drafts this step (`choose_drafters`, then each request's probe)."""
        cost = self.cost
        if cost is None:
            return [True] * len(slots)
        shape = StepShape(tokens=decoding, rows=fixed_rows + len(slots))
        gains = choose_drafters([s.history.outlook(self.history) for s in slots], shape, cost)
        return [s.probe.drafts(g) for s, g in zip(slots, gains)]

    # ---- after drafting ------------------------------------------------------------------------------------
    def cut(self, trees: list[Work], fixed_rows: int, decoding: int) -> None:
        """Each scored tree of a greedy request cut to its best nodes by calibrated value, so the step's expected
        tokens per ms is highest. Each tree's values before the cut are kept on its work item (`observe` averages
        them)."""
        sizable = [w for w in trees if sizable_tree(w)]
        values = [tree_values(w.draft, w.slot.calibration) for w in sizable]
        for w, vs in zip(sizable, values):
            w.values = vs
        cost = self.cost
        if cost is None:
            self.planned = False
            return
        fixed_rows += len(trees) + sum(w.draft.size - 1 for w in trees if w not in sizable)
        shape = StepShape(tokens=decoding, rows=fixed_rows, sunk_ms=1000 * sum(w.draft_s for w in trees))
        kept = cut_trees(values, shape, cost)
        for w, n, vs in zip(sizable, kept, values):
            w.draft.keep_best(n, vs)
        self.planned = True

    # ---- after verifying -------------------------------------------------------------------------------------
    def observe(self, w: Work, nodes: list[int], ms: float, planned: bool) -> None:
        """A drafted request's verified step (`w`, its path's `nodes`): the values of its tree's nodes before the cut,
        the tokens its copies brought past the drafter's path, the time its drafting took (the tree, the copies, the
        drafter's catch-up, the step's bookkeeping); and, for a scored tree, how deep the path went among the
        drafter's nodes against what their probabilities said. A step the budget did not plan (no cost curve yet)
        calibrates but does not count in the averages."""
        slot, draft = w.slot, w.draft
        tree, from_drafter = draft.drafted, draft.accepted_from(nodes[1:], DRAFTER)
        if tree is not None and tree.scores is not None:
            by_depth = expected_by_depth(path_probs(tree.scores[1:]), tree.depths[1:].tolist())
            slot.calibration.observe(by_depth, from_drafter)
            self.calibration.observe(by_depth, from_drafter)
        if not planned:
            return
        # A tree with no scores (static, a chain, a sampled chain) is worth what it brought.
        values = w.values if w.values is not None else [1.0] * from_drafter
        extra = len(nodes) - 1 - from_drafter
        copy_rows = draft.size - (tree.tokens.numel() if tree is not None else 1)
        slot.history.add(values, extra, 1000 * ms, copy_rows)
        self.history.add(values, extra, 1000 * ms, copy_rows)


def sizable_tree(w: Work) -> bool:
    """A tree the budget may cut: a greedy request's drafter tree with scored nodes, nothing grafted yet."""
    tree = w.draft.drafted
    return w.slot.request.greedy_acceptance and tree is not None and tree.scores is not None


def tree_values(draft: DraftTree, calibration: DepthCalibration) -> list[float]:
    """The calibrated value of each node of a drafted tree, the root excluded."""
    tree = draft.drafted
    return node_values(path_probs(tree.scores[1:]), tree.parents[1:].tolist(), tree.depths[1:].tolist(),
                       calibration)
