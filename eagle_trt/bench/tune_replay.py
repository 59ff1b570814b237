"""`eagle-trt tune`, acceptance by replay: the drafter and the lookup copies at every position of the
target's own greedy output, scored as greedy verification would, then walked along the decode path."""

from __future__ import annotations

from typing import Callable

import torch

from eagle_trt.bench.tune_choice import LOOKUP_OFF, Setting, row_caps, walk
from eagle_trt.errors import InputError
from eagle_trt.runtime.tree_drafter import min_score_of
from eagle_trt.speculative.lookup import NgramIndex, copied_chains, matched, trie_size, within_rows


def _candidates(drafter, k: int, depth: int):
    """The full dynamic tree's candidates (no size cut): (scores, parents, depths, tokens) in creation order."""
    c = drafter.grow_candidates(k, depth)
    return c.scores, c.parents, c.depths, c.tokens


def accepted_lengths(scores, parents, depths, tokens, continuation: list[int], settings) -> dict:
    """For each (d, N, threshold) in settings, given the true continuation: (draft tokens greedy verification
    accepts, draft tokens the tree holds) when the runtime keeps the best N candidates up to depth d whose
    cumulative draft probability is at least the threshold (0 = every one).

    The runtime's cut (`select_top_nodes`) ranks candidates by (score desc, depth, creation order) and keeps a
    prefix of that ranking; the ranking of the candidates up to depth d is the full one with the deeper ones left
    out, and a threshold keeps a prefix of it too (scores descend along it). So one sort serves every setting:
    each reads the deepest fully matching candidate within its prefix."""
    sc, par, dep, tok = scores.tolist(), parents.tolist(), depths.tolist(), tokens.tolist()
    good = [False] * len(sc)  # the whole root..candidate path matches the continuation
    for c in range(len(sc)):
        if dep[c] <= len(continuation) and tok[c] == continuation[dep[c] - 1]:
            good[c] = par[c] < 0 or good[par[c]]
    order = sorted(range(len(sc)), key=lambda j: (-sc[j], dep[j], j))
    by_depth: dict[int, list[tuple[int, float]]] = {}
    for d, total, threshold in settings:
        by_depth.setdefault(d, []).append((total, threshold))
    out = {}
    for d, trees in by_depth.items():
        ranked = [j for j in order if dep[j] <= d]
        deepest = [0]  # deepest[i]: the deepest fully matching candidate among ranked[:i] (0: none)
        for j in ranked:
            deepest.append(max(deepest[-1], dep[j] if good[j] else 0))
        sure = {}  # per threshold: how many of the ranked candidates reach it (a prefix)
        for c in {c for _, c in trees}:
            floor = min_score_of(c)
            sure[c] = len(ranked) if floor is None else sum(1 for j in ranked if sc[j] >= floor)
        for total, threshold in trees:
            m = min(total, sure[threshold])
            out[(d, total, threshold)] = (deepest[m], m)
    return out


def replay(session, seq: list[int], roots: list[int], settings: list[Setting], end: int | None = None
           ) -> tuple[dict, dict]:
    """Accepted draft tokens per root position and setting, for the token sequence `seq` whose part after
    the prompt is the target's own greedy output. As in the runtime, a tree at root n is no deeper than the
    end - 1 - n tokens the run may still emit (`end`: prompt + max_new_tokens, capped at the model's positions;
    default len(seq)). Returns ({root: {Setting: (accepted, draft tokens verified)}}, drafter state).

    A threshold cuts the runtime's growth too (branches below it are not expanded), which keeps the same
    candidates above it as the full growth replayed here: a child never scores above its parent."""
    runner = session.runner
    drafter = runner.drafter
    by_beam: dict[int, set] = {}
    for s in settings:
        by_beam.setdefault(s.beam_width, set()).add((s.draft_length, s.total_tokens, s.confidence_threshold))
    length = len(seq)
    end = length if end is None else end
    aux = None
    with torch.inference_mode():
        if drafter.needs_features:  # the target's features of the whole sequence, for a head that reads them
            aux = runner.features_of(seq)
        # The drafter over the whole sequence at once, as its `extend` would feed it piece by piece.
        primed = drafter.replay_state(seq, aux)
    out = {}
    # Descending roots: growing a tree at root n overwrites drafter cache slots after root n only, which smaller
    # roots never read.
    for n in sorted(set(roots), reverse=True):
        drafter.seek(primed, n)
        res = {}
        room = end - 1 - n
        for k, trees in by_beam.items():
            cut = {(d, total, c): (min(d, room), total, c) for d, total, c in trees}
            depth = max(d for d, _, _ in cut.values())
            cand = _candidates(drafter, k, depth)
            acc = accepted_lengths(*cand, seq[n + 1: n + 1 + depth], set(cut.values()))
            for (d, total, c), key in cut.items():
                res[Setting(k, d, total, confidence_threshold=c)] = acc[key]
        out[n] = res
    state = {"seq": seq, "aux": aux, "primed": primed, "root": min(roots)}
    return out, state


def lookup_replay(seq: list[int], prompt_len: int, roots: list[int], keys: list[tuple[tuple[int, int, int], int | None]],
                  datastore=None, end: int | None = None) -> dict[int, dict[tuple, tuple[int, int]]]:
    """For each root position and (lookup setting, copy budget) of `keys`: (tokens the copies get accepted, verify
    rows they add) when the runtime grafts them there. The copies are the runtime's own (`copied_chains` over the
    context seq[:root + 1] and `datastore`, no longer than the end - 1 - root tokens still to emit (`end` as in
    `replay`), cut by `within_rows` to the budget; None = no cut); rows count the copies' distinct prefixes, not
    the nodes they may share with the head's tree (an upper bound of one or two rows)."""
    index = NgramIndex()
    index.extend(seq[:prompt_len])
    by_lookup: dict[tuple[int, int, int], list] = {}
    for lk, budget in dict.fromkeys(keys):
        by_lookup.setdefault(lk, []).append(budget)
    end = len(seq) if end is None else end
    out = {}
    for n in sorted(set(roots)):
        index.extend(seq[len(index.tokens): n + 1])
        continuation = seq[n + 1:]
        res = {}
        for lk, budgets in by_lookup.items():
            if lk[0] <= 0:
                res.update({(lk, b): (0, 0) for b in budgets})
                continue
            found = copied_chains(index, datastore, min(lk[0], end - 1 - n), lk[1], lk[2])
            for b in budgets:
                chains, more = within_rows(*found, b)
                res[(lk, b)] = (max((matched(c, continuation) for c in chains + more), default=0),
                                trie_size(chains + more))
        out[n] = res
    return out


def scored_settings(settings: list[Setting], grid: list[tuple[int, int, int]], caps: list[int] = ()) -> list[Setting]:
    """Every setting calibration scores: each head tree with each lookup setting and, where it matters, each row
    cap (`row_caps`)."""
    return [s.plus(lk, c) for s in settings for lk in grid for c in (row_caps(s, lk, caps) if lk[0] > 0 else [0])]


def _add(total: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
    """total + part for [settings, bins] counts whose bin counts differ (the shorter is padded with zeros)."""
    if total is None:
        return part
    width = max(total.shape[1], part.shape[1])
    pad = torch.nn.functional.pad
    return pad(total, (0, width - total.shape[1])) + pad(part, (0, width - part.shape[1]))


def calibrate(session, encoded: list[list[int]], max_new_tokens: int, positions: int, settings: list[Setting],
              grid: list[tuple[int, int, int]] = (LOOKUP_OFF,), progress: Callable[[str], None] | None = None,
              caps: list[int] = ()) -> tuple[dict[Setting, float], dict[Setting, dict[int, float]], dict]:
    """Measured tau per head setting x lookup setting (`grid`) x row cap (`caps`, see `row_caps`) by replay over
    the calibration prompts, the share of steps verifying each number of rows besides the root ({rows: share}:
    the head's tree, fewer than total_tokens where a confidence threshold cuts it, and the copies), and one drafter
    state (prefix length, root, sequence) for the timing measurements.

    positions <= 0: every position is replayed and each setting's steps follow the runtime's own path (`walk`),
    so tau is what decoding those prompts would measure. positions > 0: that many evenly spaced positions per
    prompt, averaged (faster; optimistic where acceptance comes in runs)."""
    runner = session.runner
    grid = list(dict.fromkeys([LOOKUP_OFF, *grid]))
    scored = scored_settings(settings, grid, caps)
    head_of = {s: i for i, s in enumerate(settings)}
    key_of = {k: i for i, k in enumerate(dict.fromkeys((s.lookup, s.copy_budget) for s in scored))}
    keys = list(key_of)
    head_col = torch.tensor([head_of[s.tree] for s in scored])
    copy_col = torch.tensor([key_of[(s.lookup, s.copy_budget)] for s in scored])
    max_depth = max(s.draft_length for s in settings)
    ahead = max(max_depth, *(lk[0] for lk in grid))
    tokens = torch.zeros(len(scored), dtype=torch.float64)
    spread, state, count = None, None, 0
    for i, ids in enumerate(encoded):
        ar = runner.generate(ids, session.decode_config(mode="ar", max_new_tokens=max_new_tokens, tuned=False))
        seq = list(ids) + ar.token_ids
        if positions > 0:
            last = len(seq) - 1 - ahead  # the last root with a full continuation behind it
            roots = sorted({round(len(ids) + j * (last - len(ids)) / max(positions - 1, 1))
                            for j in range(positions)}) if last >= len(ids) else []
        else:
            roots = list(range(len(ids), len(seq) - 1))  # every root decoding can have, to the end
        if not roots:
            continue
        end = min(len(ids) + max_new_tokens, runner.max_positions)  # where the runtime's trees are cut
        per_root, state = replay(session, seq, roots, settings, end)  # the last prompt's state stays usable
        state["prompt_len"] = len(ids)
        copies = lookup_replay(seq, len(ids), roots, keys, getattr(runner, "datastore", None), end)
        # [roots, scored settings, 2]: (accepted, rows) of the head's tree, then of the copies
        head = torch.tensor([[per_root[n][s] for s in settings] for n in roots])[:, head_col]
        copy = torch.tensor([[copies[n][k] for k in keys] for n in roots])[:, copy_col]
        # A step accepts the longer of the head's path and the best copy (both are paths of the one tree), and
        # verifies besides the root the head's kept tree and the copies.
        accepted = torch.maximum(head[..., 0], copy[..., 0])  # [roots, scored settings]
        rows = head[..., 1] + copy[..., 1]
        if positions > 0:
            tokens += (accepted + 1).sum(0)
            part = torch.zeros(len(scored), int(rows.max()) + 1, dtype=torch.float64)
            part.scatter_add_(1, rows.t(), torch.ones(rows.t().shape, dtype=torch.float64))
        else:
            t, _, part = walk(accepted, rows)
            tokens += t
        spread = _add(spread, part)
        count += len(roots)
        if progress:
            progress(f"calibration prompt {i + 1}/{len(encoded)}: {len(roots)} positions")
    if count == 0:
        raise InputError("no calibration position: the prompts' AR outputs are shorter than the tree depth",
                         hint="raise --max-new-tokens or lower --max-depth")
    steps = spread.sum(1)
    taus = {s: float(tokens[j] / steps[j]) for j, s in enumerate(scored)}
    shares = {s: {int(x): float(spread[j, x] / steps[j]) for x in spread[j].nonzero().flatten().tolist()}
              for j, s in enumerate(scored)}
    return taus, shares, {**state, "positions": count}
