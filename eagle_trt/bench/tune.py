"""`eagle-trt tune`: pick the dynamic-tree settings that maximize expected tokens/s on this machine.

Expected tokens/s of a setting (beam width k, depth d, total tokens N, lookup L) is

    tau / (draft(k, d) + extend(tau) + lookup(L) + verify(N + 1 + rows(L)))

where verify(T) is the measured target forward over T tokens (the verify-cost curve), draft(k, d) the
measured time to grow a tree, extend(n) the measured time to feed n accepted tokens back to the head,
and tau the acceptance measured by replay: the target's greedy continuation of some calibration
prompts is known (plain AR decoding), so at every position the drafter grows one large tree per beam
width and every (d, N) sub-tree of it is scored against that continuation exactly as greedy
verification would (a dynamic tree of depth d and size N keeps the N best-scored candidates up to depth
d, so it is a sub-tree of the deeper one). Each setting's steps then follow the path decoding takes
(`walk`: a step at position r that accepts a tokens puts the next root at r + a + 1), so tau is the
runtime's tokens per step on those prompts, not an average over positions.

Prompt lookup is part of a setting: (lookup_tokens, lookup_branches, datastore_branches) copies from the
context and the datastore are grafted onto the tree at runtime, so the replay also computes, at every
root, the copies each lookup setting would graft there (`lookup_replay`, the runtime's own
`copied_chains`): how many tokens the best copy gets accepted and how many verify rows the copies add. A
step accepts the longest of the head's path and the copies', and verifies N + 1 + those rows.

The model leaves out per-step work it does not time (tree bookkeeping, mask building, KV compaction, token
emission) and the plain-decoding fallback after repeated misses, so the few best-predicted settings, the
best one without lookup and the build default are then *run* on the calibration prompts, each with the
fallback on and off, interleaved over repeats (`measure_end_to_end`), and the fastest measured wins.
The same runs check every speculative output against plain AR decoding.

The choice (`choose`) is a pure function of those measurements and is unit-tested on synthetic curves;
`store_tuned` writes tuned.json into the engine and re-lists it in manifest.json with its sha256.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from eagle_trt.bench.stats import interpolate, median_seconds

TOTALS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)


LOOKUP_OFF = (0, 1, 0)  # (lookup_tokens, lookup_branches, datastore_branches) with prompt lookup off


@dataclass(frozen=True, order=True)
class Setting:
    beam_width: int
    draft_length: int
    total_tokens: int
    lookup_tokens: int = 0  # copies of up to this many tokens grafted on the tree (0 = prompt lookup off)
    lookup_branches: int = 1  # from the context
    datastore_branches: int = 0  # from the datastore

    @property
    def tree(self) -> "Setting":
        """The head's part alone (lookup off)."""
        return Setting(self.beam_width, self.draft_length, self.total_tokens)

    @property
    def lookup(self) -> tuple[int, int, int]:
        return (self.lookup_tokens, self.lookup_branches, self.datastore_branches) if self.lookup_tokens else LOOKUP_OFF

    def plus(self, lookup: tuple[int, int, int]) -> "Setting":
        return Setting(self.beam_width, self.draft_length, self.total_tokens, *lookup)


def lookup_grid(tokens: list[int], branches: list[int], datastore: list[int], room: int,
                include: list[tuple[int, int, int]] = ()) -> list[tuple[int, int, int]]:
    """Every (lookup_tokens, lookup_branches, datastore_branches) worth scoring: lookup off, and each
    combination with tokens > 0 whose copies fit `room` verify rows; plus `include`."""
    out = {LOOKUP_OFF, *include}
    for t in tokens:
        for b in branches:
            for ds in datastore:
                if t > 0 and b >= 1 and ds >= 0 and t * (b + ds) <= room:
                    out.add((t, b, ds))
    return sorted(out)


def candidate_count(k: int, d: int) -> int:
    """Draft candidates a dynamic tree of beam k and depth d creates (k at depth 1, k*k per later level)."""
    return k + (d - 1) * k * k


def candidate_settings(beams: list[int], max_depth: int, room: int, totals=TOTALS,
                       include: list[Setting] = ()) -> list[Setting]:
    """Every (k, d, N) worth scoring: d <= N <= min(candidates, room), k*d <= room; plus `include`."""
    out = set(include)
    for k in beams:
        for d in range(1, max_depth + 1):
            if k * d > room:
                continue
            top = min(candidate_count(k, d), room)
            for n in {d, *totals}:
                if d <= n <= top:
                    out.add(Setting(k, d, n))
    return sorted(out)


def predict_tps(tau: float, draft_ms: float, extend_ms: float, verify_ms: float, lookup_ms: float = 0.0) -> float:
    step = draft_ms + extend_ms + verify_ms + lookup_ms
    return 1e3 * tau / step if step > 0 else 0.0


def choose(taus: dict[Setting, float], verify_ms: dict[int, float], draft_ms: dict[tuple[int, int], float],
           extend_ms: dict[int, float], lookup_rows: dict[Setting, float] | None = None,
           lookup_ms: dict[tuple, float] | None = None) -> list[dict]:
    """Rank settings by predicted tokens/s (best first; ties go to the smaller tree, then to less lookup).

    taus: measured tau per setting; verify_ms: forward ms per token count (root included);
    draft_ms: tree-growing ms per (beam width, depth); extend_ms: head-update ms per accepted count;
    lookup_rows: mean verify rows a setting's copies add per step; lookup_ms: ms to find and graft the copies
    of a lookup setting (both 0 with lookup off)."""
    ranked = []
    for s, tau in taus.items():
        if (s.beam_width, s.draft_length) not in draft_ms:
            continue
        rows = (lookup_rows or {}).get(s, 0.0) if s.lookup_tokens else 0.0
        lk = (lookup_ms or {}).get(s.lookup, 0.0) if s.lookup_tokens else 0.0
        v = interpolate(verify_ms, s.total_tokens + 1 + rows)
        e = interpolate(extend_ms, tau)
        d = draft_ms[(s.beam_width, s.draft_length)]
        ranked.append({**asdict(s), "tau": tau, "draft_ms": d, "extend_ms": e, "verify_ms": v, "lookup_rows": rows,
                       "lookup_ms": lk, "predicted_tokens_per_second": predict_tps(tau, d, e, v, lk)})
    ranked.sort(key=lambda r: (-r["predicted_tokens_per_second"], r["total_tokens"], r["beam_width"],
                               r["draft_length"], r["lookup_tokens"], r["lookup_branches"], r["datastore_branches"]))
    return ranked


# ---- measurement ---------------------------------------------------------------------------------

def _candidates(drafter, k: int, depth: int):
    """The full dynamic tree's candidates (no size cut): (scores, parents, depths, tokens) in creation order."""
    c = drafter.grow_candidates(k, depth)
    return c.scores, c.parents, c.depths, c.tokens


def accepted_lengths(scores, parents, depths, tokens, continuation: list[int], settings) -> dict:
    """Draft tokens greedy verification accepts for each (d, N) in settings, given the true continuation."""
    from eagle_trt.speculative.tree import select_top_nodes

    n = scores.numel()
    good = torch.zeros(n, dtype=torch.bool)  # the whole root..candidate path matches the continuation
    dep, par, tok = depths.tolist(), parents.tolist(), tokens.tolist()
    for c in range(n):
        if dep[c] <= len(continuation) and tok[c] == continuation[dep[c] - 1]:
            good[c] = par[c] < 0 or bool(good[par[c]])
    upto = {}
    for d in sorted({d for d, _ in settings}):
        upto[d] = sum(1 for x in dep if x <= d)  # levels are created in order: a prefix of the list
    out = {}
    for d, total in settings:
        m = upto[d]
        kept, _ = select_top_nodes(scores[:m], parents[:m], depths[:m], total)
        hit = kept[good[kept]]
        out[(d, total)] = int(depths[hit].max()) if hit.numel() else 0
    return out


def replay(session, seq: list[int], roots: list[int], settings: list[Setting]) -> tuple[dict, dict]:
    """Accepted draft tokens per root position and setting, for the token sequence `seq` whose part after
    the prompt is the target's own greedy output. Returns ({root: {Setting: accepted}}, drafter state)."""
    runner = session.runner
    target, drafter, head = runner.target, runner.drafter, runner.drafter.head
    by_beam: dict[int, set] = {}
    for s in settings:
        by_beam.setdefault(s.beam_width, set()).add((s.draft_length, s.total_tokens))
    length = len(seq)
    with torch.inference_mode():
        runner.cache.length = 0
        _, aux = target.forward(torch.tensor(seq), torch.arange(length), runner.cache, need_aux=True,
                                logits_rows=torch.tensor([length - 1]))
        # The head over the whole sequence at once, as `Drafter.extend` would feed it piece by piece:
        # draft position t reads (feature t, token t+1).
        drafter.reset()
        t = length - 1
        mask = torch.ones(t, t, dtype=torch.bool).tril_()
        logits, hidden = head.forward(head.fuse(aux[:t]), torch.tensor(seq[1:]), torch.arange(t), drafter.cache, 0,
                                      mask)
    out = {}
    # Descending roots: growing a tree at root n overwrites head cache slots >= n only, which smaller
    # roots never read.
    for n in sorted(set(roots), reverse=True):
        drafter.cache.length = n
        drafter.last_logits, drafter.last_hidden = logits[n - 1], hidden[n - 1]
        res = {}
        for k, pairs in by_beam.items():
            depth = max(d for d, _ in pairs)
            cand = _candidates(drafter, k, depth)
            for (d, total), acc in accepted_lengths(*cand, seq[n + 1: n + 1 + depth], pairs).items():
                res[Setting(k, d, total)] = acc
        out[n] = res
    state = {"seq": seq, "aux": aux, "logits": logits, "hidden": hidden, "root": min(roots)}
    return out, state


def lookup_replay(seq: list[int], prompt_len: int, roots: list[int], grid: list[tuple[int, int, int]],
                  datastore=None) -> dict[int, dict[tuple[int, int, int], tuple[int, int]]]:
    """For each root position and lookup setting of `grid`: (tokens the copies get accepted, verify rows they
    add) when the runtime grafts them there. The copies are the runtime's own (`copied_chains` over the
    context seq[:root + 1] and `datastore`); rows count the copies' distinct prefixes, not the nodes they may
    share with the head's tree (an upper bound of one or two rows)."""
    from eagle_trt.speculative.lookup import NgramIndex, copied_chains, matched, trie_size

    index = NgramIndex()
    index.extend(seq[:prompt_len])
    out = {}
    for n in sorted(set(roots)):
        index.extend(seq[len(index.tokens): n + 1])
        continuation = seq[n + 1:]
        res = {}
        for lk in grid:
            if lk[0] <= 0:
                res[lk] = (0, 0)
                continue
            chains, more = copied_chains(index, datastore, *lk)
            res[lk] = (max((matched(c, continuation) for c in chains + more), default=0), trie_size(chains + more))
        out[n] = res
    return out


def walk(accepted: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The runtime's own path through one sequence, for many settings at once.

    accepted[r, c]: draft tokens setting c gets accepted with its root at the r-th of R consecutive positions,
    the last R tokens but one of the output (acceptance at r capped at the R - r tokens left); rows[r, c]:
    verify rows it adds there (optional). A step at root r commits accepted + 1 tokens (the bonus token is the
    next root), so the next step's root is r + accepted + 1; a step that reaches the output's end commits
    only what is left, as decoding stops there. Returns per setting (tokens committed, steps, rows summed
    over the steps).

    Averaging acceptance over every position instead would over-weight runs of easy tokens (a copied
    stretch of 8 is crossed in one step but holds 8 positions), which is exactly where prompt lookup shines."""
    count, settings = accepted.shape
    at = torch.zeros(settings, dtype=torch.long)
    cols = torch.arange(settings)
    tokens = torch.zeros(settings, dtype=torch.float64)
    steps = torch.zeros(settings, dtype=torch.float64)
    added = torch.zeros(settings, dtype=torch.float64)
    alive = torch.ones(settings, dtype=torch.bool)
    while bool(alive.any()):
        here = at.clamp(max=count - 1)
        a = accepted[here, cols]
        tokens += torch.where(alive, torch.minimum(a + 1, count - at), 0)  # the last step stops at the end
        steps += alive
        if rows is not None:
            added += torch.where(alive, rows[here, cols], 0)
        at = at + a + 1
        alive &= at < count
    return tokens, steps, added


def calibrate(session, encoded: list[list[int]], max_new_tokens: int, positions: int, settings: list[Setting],
              grid: list[tuple[int, int, int]] = (LOOKUP_OFF,), progress: Callable[[str], None] | None = None
              ) -> tuple[dict[Setting, float], dict[Setting, float], dict]:
    """Measured tau per head setting x lookup setting (`grid`) by replay over the calibration prompts, the mean
    verify rows the copies add per step, and one drafter state (prefix length, root, sequence) for the timing
    measurements.

    positions <= 0: every position is replayed and each setting's steps follow the runtime's own path (`walk`),
    so tau is what decoding those prompts would measure. positions > 0: that many evenly spaced positions per
    prompt, averaged (faster; optimistic where acceptance comes in runs)."""
    runner = session.runner
    grid = list(dict.fromkeys([LOOKUP_OFF, *grid]))
    max_depth = max(s.draft_length for s in settings)
    ahead = max(max_depth, *(lk[0] for lk in grid))
    shape = (len(settings), len(grid))
    tokens, steps, added = (torch.zeros(shape, dtype=torch.float64) for _ in range(3))
    state, count = None, 0
    for i, ids in enumerate(encoded):
        ar = runner.generate(ids, session.decode_options(mode="ar", max_new_tokens=max_new_tokens, tuned=False))
        seq = list(ids) + ar.token_ids
        if positions > 0:
            last = len(seq) - 1 - ahead  # the last root with a full continuation behind it
            roots = sorted({round(len(ids) + j * (last - len(ids)) / max(positions - 1, 1))
                            for j in range(positions)}) if last >= len(ids) else []
        else:
            roots = list(range(len(ids), len(seq) - 1))  # every root decoding can have, to the end
        if not roots:
            continue
        per_root, state = replay(session, seq, roots, settings)  # the last prompt's state stays usable
        state["prompt_len"] = len(ids)
        copies = lookup_replay(seq, len(ids), roots, grid, getattr(runner, "datastore", None))
        head = torch.tensor([[per_root[n][s] for s in settings] for n in roots])
        copied = torch.tensor([[copies[n][lk][0] for lk in grid] for n in roots])
        rows = torch.tensor([[copies[n][lk][1] for lk in grid] for n in roots], dtype=torch.float64)
        # A step accepts the longer of the head's path and the best copy (both are paths of the one tree).
        accepted = torch.maximum(head[:, :, None], copied[:, None, :])  # [roots, settings, grid]
        rows = rows[:, None, :].expand_as(accepted)
        if positions > 0:
            tokens += (accepted + 1).sum(0)
            steps += len(roots)
            added += rows.sum(0)
        else:
            t, n, r = walk(accepted.reshape(len(roots), -1), rows.reshape(len(roots), -1))
            tokens += t.view(shape)
            steps += n.view(shape)
            added += r.view(shape)
        count += len(roots)
        if progress:
            progress(f"calibration prompt {i + 1}/{len(encoded)}: {len(roots)} positions")
    if count == 0:
        from eagle_trt.errors import InputError

        raise InputError("no calibration position: the prompts' AR outputs are shorter than the tree depth",
                         hint="raise --max-new-tokens or lower --max-depth")
    taus = {s.plus(lk): float(tokens[i, j] / steps[i, j]) for i, s in enumerate(settings) for j, lk in enumerate(grid)}
    rows = {s.plus(lk): float(added[i, j] / steps[i, j]) for i, s in enumerate(settings) for j, lk in enumerate(grid)}
    return taus, rows, {**state, "positions": count}


def measure_costs(session, state: dict, settings: list[Setting], reps: int = 3,
                  grid: list[tuple[int, int, int]] = (), max_rows: float = 0.0) -> dict:
    """draft ms per (k, d), extend ms per accepted count, verify ms per tree size (up to the largest tree plus
    `max_rows` copied rows), and ms to find and graft the copies of each lookup setting of `grid` (all medians)."""
    from eagle_trt.bench.roofline import default_sizes, forward_curve
    from eagle_trt.runtime.runner import with_lookup
    from eagle_trt.speculative.lookup import NgramIndex, copied_chains

    runner = session.runner
    drafter = runner.drafter
    seq, aux, n = state["seq"], state["aux"], state["root"]

    def at_root():
        drafter.cache.length = n
        drafter.last_logits, drafter.last_hidden = state["logits"][n - 1], state["hidden"][n - 1]

    draft = {}
    biggest: dict[tuple[int, int], int] = {}
    for s in settings:
        key = (s.beam_width, s.draft_length)
        biggest[key] = max(biggest.get(key, 0), s.total_tokens)
    for (k, d), total in sorted(biggest.items()):
        at_root()
        draft[(k, d)] = median_seconds(lambda: drafter.draft_dynamic(seq[n], k, d, total), reps) * 1e3
    max_depth = max(s.draft_length for s in settings)
    extend = {}
    for m in range(1, max_depth + 2):
        def feed():
            at_root()
            drafter.extend(aux[n: n + m], torch.tensor(seq[n + 1: n + 1 + m]))
        if n + 1 + m <= len(seq):
            extend[m] = median_seconds(feed, reps) * 1e3
    lookup = {}
    copies = [lk for lk in grid if lk[0] > 0]
    if copies:
        # At the root of the replay state, onto a head tree of the size most settings use.
        at_root()
        k, d = min(biggest)
        tree = drafter.draft_dynamic(seq[n], k, d, max(d, min(8, biggest[(k, d)])))
        index = NgramIndex()
        index.extend(seq[: n + 1])
        store = getattr(runner, "datastore", None)
        for lk in copies:
            lookup[lk] = median_seconds(lambda: with_lookup(tree, *copied_chains(index, store, *lk)), reps) * 1e3
    at_root()
    max_tree = max(s.total_tokens for s in settings) + 1 + math.ceil(max_rows)
    context = n
    verify = {t: s * 1e3 for t, s in forward_curve(runner.target, default_sizes(max_tree), context, reps).items()}
    return {"draft_ms": draft, "extend_ms": extend, "verify_ms": verify, "lookup_ms": lookup,
            "context_tokens": context}


def _setting(row: dict) -> Setting:
    return Setting(**{f: row[f] for f in Setting.__dataclass_fields__ if f in row})


def finalists(ranked: list[dict], default: dict | None, n: int, extra: list[dict | None] = ()) -> list[Setting]:
    """The n best-predicted settings, then `extra` and the build default (no duplicates), in that order."""
    picked = [_setting(r) for r in ranked[:max(n, 0)]]
    picked += [_setting(r) for r in (*extra, default) if r is not None]
    return list(dict.fromkeys(picked))


def run_name(s: Setting, fallback_after: int) -> str:
    lookup = f"+lookup{s.lookup_tokens}x{s.lookup_branches}+{s.datastore_branches}" if s.lookup_tokens else ""
    return f"{s.beam_width}x{s.draft_length}x{s.total_tokens}{lookup}/fallback{fallback_after}"


def measure_end_to_end(session, encoded: list[list[int]], max_new_tokens: int, settings: list[Setting],
                       repeats: int = 2, fallbacks: tuple[int, ...] = (2,)) -> dict:
    """Decode every calibration prompt with plain AR and with each setting (tree and lookup), once per
    `fallbacks` value (DecodeOptions.fallback_after: plain decoding after that many verify steps in a row accept
    nothing; 0 = never), through the bench harness: same interleaving, tokens/s and AR check as `bench`.

    Returns {"ar": tok/s (median), "variants": {(Setting, fallback): {"tokens_per_second", "tau"}},
    "mismatches": [(Setting, fallback), ...]}; a mismatch is a run whose output differs from AR on some
    prompt (a lossless-ness failure)."""
    from eagle_trt.bench.harness import run_bench
    from eagle_trt.bench.methods import OursMethod
    from eagle_trt.bench.prompts import Prompt

    runs = {run_name(s, f): (s, f) for s in settings for f in dict.fromkeys(fallbacks)}
    methods = [OursMethod("ar", session.runner, session.decode_options(mode="ar", tuned=False))]
    methods += [OursMethod(name, session.runner, session.decode_options(
        tree="dynamic", beam_width=s.beam_width, draft_length=s.draft_length, total_tokens=s.total_tokens,
        fallback_after=f, lookup_tokens=s.lookup_tokens, lookup_branches=s.lookup_branches,
        datastore_branches=s.datastore_branches, tuned=False)) for name, (s, f) in runs.items()]
    prompts = [(Prompt(id=f"calibration-{i}", category="calibration"), ids) for i, ids in enumerate(encoded)]
    res = run_bench(methods, prompts, max_new_tokens, repeats, warmup=False,
                    references={name: ("ar", True) for name in runs})
    summary = res["summary"]
    return {"ar": summary["ar"]["tokens_per_second"]["median"],
            "variants": {v: {"tokens_per_second": summary[name]["tokens_per_second"]["median"],
                             "tau": summary[name]["acceptance_length"]} for name, v in runs.items()},
            "mismatches": sorted({runs[c["method"]] for c in res["failures"]})}


def default_fallback() -> int:
    from eagle_trt.runtime.runner import DecodeOptions

    return DecodeOptions.__dataclass_fields__["fallback_after"].default


def tree_room(cfg) -> int:
    """Largest total_tokens / beam*depth the engine's KV cache reserves room for (see Session.open)."""
    return max(cfg.total_tokens, cfg.max_beam_width * cfg.draft_length, 64)


def lookup_room(cfg) -> int:
    """Most copied tokens a step may graft within the engine's KV cache (see Session.open)."""
    return max(cfg.lookup_tokens * (cfg.lookup_branches + cfg.datastore_branches), 64)


def engine_lookup(cfg, has_datastore: bool) -> tuple[int, int, int]:
    """The build config's lookup setting as the runtime applies it."""
    if cfg.lookup_tokens <= 0:
        return LOOKUP_OFF
    return (cfg.lookup_tokens, cfg.lookup_branches, cfg.datastore_branches if has_datastore else 0)


def tune_engine(session, encoded: list[list[int]], max_new_tokens: int = 64, positions: int = 0,
                max_depth: int = 8, beams: list[int] | None = None, reps: int = 3,
                progress: Callable[[str], None] | None = None, validate: int = 3, validate_repeats: int = 2,
                lookup_tokens: list[int] = (), lookup_branches: list[int] = (1,),
                datastore_branches: list[int] = (0,)) -> dict:
    """Measure everything and rank the settings; returns {"best", "default", "ranked", "measured", ...}.

    Settings are head trees (beam width, depth, total tokens) crossed with the lookup settings of
    `lookup_grid(lookup_tokens, lookup_branches, datastore_branches)` (datastore branches only where the
    engine has a datastore; lookup off always). With validate > 0 the `validate` best-predicted settings, the
    best-predicted one without lookup and the build default are run end to end (`measure_end_to_end`), each
    with the plain-decoding fallback on and off, and "best" is the fastest of them as measured; every ranked
    row of a finalist gains "measured_tokens_per_second", "measured_tau", "fallback_after" and
    "measured_by_variant", and the result "validation"."""
    cfg = session.config
    has_store = getattr(session.runner, "datastore", None) is not None
    # All-zero lookup_tokens: lookup off only; else the engine's own lookup setting is scored too.
    own = engine_lookup(cfg, has_store) if any(t > 0 for t in lookup_tokens) else LOOKUP_OFF
    default = Setting(cfg.max_beam_width, cfg.draft_length, cfg.total_tokens, *own)
    beams = sorted({b for b in (beams or [1, 2, 4, 8]) if 1 <= b <= cfg.max_beam_width} | {cfg.max_beam_width})
    max_depth = min(max(max_depth, cfg.draft_length), 32)
    settings = candidate_settings(beams, max_depth, tree_room(cfg), include=[default.tree])
    grid = lookup_grid(list(lookup_tokens), list(lookup_branches), list(datastore_branches) if has_store else [0],
                       lookup_room(cfg), include=[own])
    t0 = time.perf_counter()
    taus, rows, state = calibrate(session, encoded, max_new_tokens, positions, settings, grid, progress)
    if progress:
        progress("measuring draft, head-update, lookup and verify costs")
    costs = measure_costs(session, state, settings, reps, grid, max(rows.values()))
    ranked = choose(taus, costs["verify_ms"], costs["draft_ms"], costs["extend_ms"], rows, costs["lookup_ms"])
    by_setting = {_setting(r): r for r in ranked}
    best, validation = ranked[0], None
    if validate > 0:
        no_lookup = next((r for r in ranked if r["lookup_tokens"] == 0), None)
        picked = finalists(ranked, by_setting.get(default), validate, extra=[no_lookup])
        fallbacks = tuple(dict.fromkeys((default_fallback(), 0)))
        if progress:
            progress(f"running {len(picked)} finalists x {len(fallbacks)} (fallback on/off) and plain AR end to end "
                     f"({validate_repeats} repeats)")
        measured = measure_end_to_end(session, encoded, max_new_tokens, picked, validate_repeats, fallbacks)
        for s in picked:
            row = by_setting[s]
            per = {f: measured["variants"][(s, f)] for f in fallbacks}
            fb = max(fallbacks, key=lambda f: per[f]["tokens_per_second"])
            row["measured_tokens_per_second"] = per[fb]["tokens_per_second"]
            row["measured_tau"] = per[fb]["tau"]
            row["fallback_after"] = fb
            row["measured_by_variant"] = {f"fallback{f}": round(m["tokens_per_second"], 3) for f, m in per.items()}
        best = by_setting[max(picked, key=lambda s: by_setting[s]["measured_tokens_per_second"])]
        validation = {"ar_tokens_per_second": measured["ar"], "repeats": validate_repeats,
                      "finalists": [by_setting[s] for s in picked],
                      "mismatches": [{**asdict(s), "fallback_after": f} for s, f in measured["mismatches"]]}
    verify = costs["verify_ms"]
    return {
        "best": best, "default": by_setting.get(default), "ranked": ranked, "validation": validation,
        "ar_predicted_tokens_per_second": 1e3 / interpolate(verify, 1),
        "measured": {"positions": state["positions"], "prompts": len(encoded), "max_new_tokens": max_new_tokens,
                     "threads": torch.get_num_threads(), "context_tokens": costs["context_tokens"],
                     "verify_ms": verify, "extend_ms": costs["extend_ms"],
                     "draft_ms": {f"{k}x{d}": v for (k, d), v in costs["draft_ms"].items()},
                     "lookup_ms": {f"{t}x{b}+{ds}": v for (t, b, ds), v in costs["lookup_ms"].items()},
                     "lookup_grid": len(grid), "datastore": has_store,
                     "seconds": time.perf_counter() - t0},
    }


# ---- storing -------------------------------------------------------------------------------------

def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store_tuned(engine_root: str | Path, best: dict, info: dict | None = None) -> Path:
    """Write engine_root/tuned.json and list it (sha256 + size) in manifest.json, both atomically.

    Session.decode_options then prefers these settings over the build config's."""
    from eagle_trt.engine.manifest import MANIFEST_NAME, FileEntry, read_manifest, sha256_file, write_manifest
    from eagle_trt.runtime.session import TUNED_NAME

    root = Path(engine_root)
    manifest = read_manifest(root)
    data = {"tree": "dynamic", "beam_width": int(best["beam_width"]), "draft_length": int(best["draft_length"]),
            "total_tokens": int(best["total_tokens"]),
            "predicted_tokens_per_second": round(best["predicted_tokens_per_second"], 3),
            "tau": round(best["tau"], 4), **(info or {})}
    data["lookup_tokens"] = int(best.get("lookup_tokens", 0))
    data["lookup_branches"] = int(best.get("lookup_branches", 1))
    data["datastore_branches"] = int(best.get("datastore_branches", 0))
    if "fallback_after" in best:
        data["fallback_after"] = int(best["fallback_after"])
        data["measured_by_variant"] = best["measured_by_variant"]
    if "measured_tokens_per_second" in best:
        data["measured_tokens_per_second"] = round(best["measured_tokens_per_second"], 3)
        data["measured_tau"] = round(best["measured_tau"], 4)
    path = root / TUNED_NAME
    _atomic_write(path, json.dumps(data, indent=2, default=str) + "\n")
    files = dict(manifest.files)
    files[TUNED_NAME] = FileEntry(sha256=sha256_file(path), bytes=path.stat().st_size)
    updated = manifest.model_copy(update={"files": files})
    # write_manifest's own format, written beside the engine and moved into place in one rename.
    tmpdir = Path(tempfile.mkdtemp(dir=root, prefix=".manifest-"))
    try:
        os.replace(write_manifest(updated, tmpdir), root / MANIFEST_NAME)
    finally:
        for p in tmpdir.iterdir():
            p.unlink()
        tmpdir.rmdir()
    return path
