"""`eagle-trt tune`: pick the dynamic-tree settings that maximize expected tokens/s on this machine.

Expected tokens/s of a setting (beam width k, depth d, total tokens N, lookup L) is

    tau / (draft(k, d) + extend(tau) + lookup(L) + mean over steps of verify(1 + rows) + other)

where verify(T) is the measured target forward over T tokens (the verify-cost curve), draft(k, d) the
measured time to grow a tree, extend(n) the measured time to feed n accepted tokens back to the head,
and tau the acceptance measured by replay: the target's greedy continuation of some calibration
prompts is known (plain AR decoding), so at every position the drafter grows one large tree per beam
width and every (d, N) sub-tree of it is scored against that continuation exactly as greedy
verification would (a dynamic tree of depth d and size N keeps the N best-scored candidates up to depth
d, so it is a sub-tree of the deeper one). Each setting's steps then follow the path decoding takes
(`walk`: a step at position r that accepts a tokens puts the next root at r + a + 1), so tau is the
runtime's tokens per step on those prompts, not an average over positions.

A setting may also carry a confidence threshold c: the runtime then verifies only the tree's candidates whose
cumulative draft probability is at least c, so a step where the head is unsure verifies few rows or just the
root (a plain step). The replay keeps, at every root, the candidates the runtime would, so each step's rows
are its own; where a verify row is dear (a 4-bit model on a CPU without AMX: integer products compute-bound
past one or two rows) a threshold buys back the rows the head would likely lose.

Prompt lookup is part of a setting: (lookup_tokens, lookup_branches, datastore_branches) copies from the
context and the datastore are grafted onto the tree at runtime, so the replay also computes, at every
root, the copies each lookup setting would graft there (`lookup_replay`, the runtime's own
`copied_chains`, cut by `within_rows` where the setting caps the verify rows): how many tokens the best
copy gets accepted and how many verify rows the copies add. A step accepts the longest of the head's path
and the copies', and verifies the root, the head's kept tree and those rows; its cost is read off the curve
at that size, step by step, since the curve has jumps (bf16's 32-row chunks) that a cost at the mean size
would hide.

`other` is the per-step work the terms leave out (tree bookkeeping, mask building, KV compaction, token
emission), measured once as the gap between one real decode's time per step and the model's prediction
for those steps (`measure_step_overhead`). The model still leaves out the plain-decoding fallback after
repeated misses and any cost that differs between settings beyond those terms, so the few best-predicted
settings, the best one without lookup and the build default are then *run* on the calibration prompts, each
with the fallback on and off, interleaved over repeats (`measure_end_to_end`), and the fastest measured wins.
The same runs check every speculative output against plain AR decoding.

Split by concept: `tune_choice` (settings, walk, ranking: pure), `tune_replay` (acceptance by replay),
`tune_store` (tuned.json into the engine, re-listed in manifest.json with its sha256); this module measures
the costs, runs the finalists end to end and ties it together.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from typing import Callable

import torch

from eagle_trt import timing
from eagle_trt.bench.stats import interpolate, median_seconds
from eagle_trt.bench.harness import run_bench
from eagle_trt.bench.methods import OursMethod
from eagle_trt.bench.prompts import Prompt
from eagle_trt.bench.roofline import default_sizes, forward_curve
from eagle_trt.bench.tune_choice import (
    LOOKUP_OFF,
    Setting,
    candidate_settings,
    choose,
    finalists,
    lookup_grid,
    row_caps,
    run_name,
    setting_of,
)
from eagle_trt.bench.tune_replay import calibrate
from eagle_trt.config.decode import DecodeConfig, copied_room, drafted_room
from eagle_trt.runtime.proposers import grafted
from eagle_trt.speculative.lookup import NgramIndex, copied_chains


def measure_costs(session, state: dict, settings: list[Setting], reps: int = 3,
                  grid: list[tuple[int, int, int]] = (), max_rows: float = 0.0) -> dict:
    """draft ms per (k, d), extend ms per accepted count, verify ms per tree size (up to the root and the largest
    tree, or `max_rows` rows besides the root where a step verifies more: copies), and ms to find and graft the
    copies of each lookup setting of `grid` (all medians)."""
    runner = session.runner
    drafter = runner.drafter
    seq, aux, n = state["seq"], state["aux"], state["root"]

    def at_root():
        drafter.seek(state["primed"], n)

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
            drafter.extend(aux[n: n + m] if aux is not None else None, torch.tensor(seq[n + 1: n + 1 + m]))
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
            lookup[lk] = median_seconds(lambda: grafted(tree, *copied_chains(index, store, *lk)), reps) * 1e3
    at_root()
    max_tree = 1 + max(max(s.total_tokens for s in settings), math.ceil(max_rows))
    context = n
    verify = {t: s * 1e3 for t, s in forward_curve(runner.target, default_sizes(max_tree), context, reps,
                                                                    runner.aux_layers).items()}
    return {"draft_ms": draft, "extend_ms": extend, "verify_ms": verify, "lookup_ms": lookup,
            "context_tokens": context}


def measure_step_overhead(session, state: dict, costs: dict, tree: Setting, max_new_tokens: int,
                          reps: int = 3) -> float:
    """Milliseconds per step that the cost model leaves out: tree building, verification bookkeeping, KV
    compaction, emitting tokens, the head's catch-up on the prompt spread over the steps.

    Decodes the replay prompt with `tree` (lookup and fallback off) and compares its time per step with what
    the model predicts for those very steps, each at its own size and acceptance. Median over `reps`, >= 0."""
    runner = session.runner
    prompt = state["seq"][: state["prompt_len"]]
    opts = session.decode_config(tree="dynamic", beam_width=tree.beam_width, draft_length=tree.draft_length,
                                  total_tokens=tree.total_tokens, confidence_threshold=tree.confidence_threshold,
                                  lookup_tokens=0, fallback_after=0, max_new_tokens=max_new_tokens, tuned=False)
    draft = costs["draft_ms"][(tree.beam_width, tree.draft_length)]
    gaps = []
    for _ in range(reps):
        m = runner.generate(prompt, opts).metrics
        if not m.steps:
            return 0.0
        model = sum(draft + interpolate(costs["extend_ms"], st.accepted + 1)
                    + interpolate(costs["verify_ms"], st.tree_size + 1) for st in m.steps) / len(m.steps)
        gaps.append((m.total_s - m.prefill_s) * 1e3 / len(m.steps) - model)
    return max(statistics.median(gaps), 0.0)


def measure_end_to_end(session, encoded: list[list[int]], max_new_tokens: int, settings: list[Setting],
                       repeats: int = 2, fallbacks: tuple[int, ...] = (2,)) -> dict:
    """Decode every calibration prompt with plain AR and with each setting (tree and lookup), once per
    `fallbacks` value (DecodeConfig.fallback_after: plain decoding after that many verify steps in a row accept
    nothing; 0 = never), through the bench harness: same interleaving, tokens/s and AR check as `bench`.

    Returns {"ar": tok/s (median), "variants": {(Setting, fallback): {"tokens_per_second", "tau"}},
    "mismatches": [(Setting, fallback), ...]}; a mismatch is a run whose output differs from AR on some
    prompt (a lossless-ness failure)."""
    runs = {run_name(s, f): (s, f) for s in settings for f in dict.fromkeys(fallbacks)}
    methods = [OursMethod("ar", session.runner, session.decode_config(mode="ar", tuned=False))]
    methods += [OursMethod(name, session.runner, session.decode_config(
        tree="dynamic", beam_width=s.beam_width, draft_length=s.draft_length, total_tokens=s.total_tokens,
        confidence_threshold=s.confidence_threshold, fallback_after=f, lookup_tokens=s.lookup_tokens,
        lookup_branches=s.lookup_branches, datastore_branches=s.datastore_branches, max_verify_rows=s.max_verify_rows,
        tuned=False))
        for name, (s, f) in runs.items()]
    prompts = [(Prompt(id=f"calibration-{i}", category="calibration"), ids) for i, ids in enumerate(encoded)]
    res = run_bench(methods, prompts, max_new_tokens, repeats, warmup=False,
                    references={name: ("ar", True) for name in runs})
    summary = res["summary"]
    return {"ar": summary["ar"]["tokens_per_second"]["median"],
            "variants": {v: {"tokens_per_second": summary[name]["tokens_per_second"]["median"],
                             "tau": summary[name]["acceptance_length"]} for name, v in runs.items()},
            "mismatches": sorted({runs[c["method"]] for c in res["failures"]})}


def default_fallback() -> int:
    return DecodeConfig.model_fields["fallback_after"].default


def engine_lookup(cfg, has_datastore: bool) -> tuple[int, int, int]:
    """The build config's lookup setting as the runtime applies it."""
    if cfg.lookup_tokens <= 0:
        return LOOKUP_OFF
    return (cfg.lookup_tokens, cfg.lookup_branches, cfg.datastore_branches if has_datastore else 0)


def validate_finalists(session, encoded: list[list[int]], max_new_tokens: int, ranked: list[dict],
                       default: dict | None, validate: int, repeats: int,
                       progress: Callable[[str], None] | None = None) -> tuple[dict, dict]:
    """Run the `validate` best-predicted settings, the best one without lookup and the build default end to end,
    each with the plain-decoding fallback on and off; each finalist's ranked row gains what was measured with its
    faster variant. Returns (the fastest finalist's row, the validation record)."""
    by_setting = {setting_of(r): r for r in ranked}
    no_lookup = next((r for r in ranked if r["lookup_tokens"] == 0), None)
    picked = finalists(ranked, default, validate, extra=[no_lookup])
    fallbacks = tuple(dict.fromkeys((default_fallback(), 0)))
    if progress:
        progress(f"running {len(picked)} finalists x {len(fallbacks)} (fallback on/off) and plain AR end to end "
                 f"({repeats} repeats)")
    measured = measure_end_to_end(session, encoded, max_new_tokens, picked, repeats, fallbacks)
    for s in picked:
        row = by_setting[s]
        per = {f: measured["variants"][(s, f)] for f in fallbacks}
        fb = max(fallbacks, key=lambda f: per[f]["tokens_per_second"])
        row["measured_tokens_per_second"] = per[fb]["tokens_per_second"]
        row["measured_tau"] = per[fb]["tau"]
        row["fallback_after"] = fb
        row["measured_by_variant"] = {f"fallback{f}": round(m["tokens_per_second"], 3) for f, m in per.items()}
    best = by_setting[max(picked, key=lambda s: by_setting[s]["measured_tokens_per_second"])]
    return best, {"ar_tokens_per_second": measured["ar"], "repeats": repeats,
                  "finalists": [by_setting[s] for s in picked],
                  "mismatches": [{**asdict(s), "fallback_after": f} for s, f in measured["mismatches"]]}


def tune_engine(session, encoded: list[list[int]], max_new_tokens: int = 64, positions: int = 0,
                max_depth: int = 8, beams: list[int] | None = None, reps: int = 3,
                progress: Callable[[str], None] | None = None, validate: int = 3, validate_repeats: int = 2,
                lookup_tokens: list[int] = (), lookup_branches: list[int] = (1,),
                datastore_branches: list[int] = (0,), max_verify_rows: list[int] = (0,),
                confidence_thresholds: list[float] = (0.0,)) -> dict:
    """Measure everything and rank the settings; returns {"best", "default", "ranked", "measured", ...}.

    Settings are head trees (beam width, depth, total tokens) crossed with the lookup settings of
    `lookup_grid(lookup_tokens, lookup_branches, datastore_branches)` (datastore branches only where the
    engine has a datastore; lookup off always), and each setting with lookup also with each cap of
    `max_verify_rows` on its verify rows where the cap cuts its copies (0 = no cap, always scored); each head
    tree is scored with each of `confidence_thresholds` (its candidates less sure than that are not verified). With
    validate > 0 the `validate` best-predicted settings, the best-predicted one without lookup and the build
    default are run end to end (`measure_end_to_end`), each with the plain-decoding fallback on and off, and
    "best" is the fastest of them as measured; every ranked row of a finalist gains
    "measured_tokens_per_second", "measured_tau", "fallback_after" and "measured_by_variant", and the result
    "validation"."""
    cfg = session.config
    has_store = getattr(session.runner, "datastore", None) is not None
    # All-zero lookup_tokens: lookup off only; else the engine's own lookup setting is scored too.
    own = engine_lookup(cfg, has_store) if any(t > 0 for t in lookup_tokens) else LOOKUP_OFF
    default = Setting(cfg.beam_width, cfg.draft_length, cfg.total_tokens,
                      confidence_threshold=cfg.confidence_threshold)
    own_cap = cfg.max_verify_rows if cfg.max_verify_rows in row_caps(default, own, [cfg.max_verify_rows]) else 0
    default = default.plus(own, own_cap)
    beams = sorted({b for b in (beams or [1, 2, 4, 8]) if 1 <= b <= cfg.beam_width} | {cfg.beam_width})
    max_depth = min(max(max_depth, cfg.draft_length), 32)
    settings = candidate_settings(beams, max_depth, drafted_room(cfg), include=[default.tree],
                                  thresholds=sorted({0.0, *confidence_thresholds}))
    grid = lookup_grid(list(lookup_tokens), list(lookup_branches), list(datastore_branches) if has_store else [0],
                       copied_room(cfg), include=[own])
    t0 = timing.now()
    caps = sorted({c for c in (*max_verify_rows, own_cap) if c > 0})
    taus, rows, state = calibrate(session, encoded, max_new_tokens, positions, settings, grid, progress, caps)
    if progress:
        progress("measuring draft, head-update, lookup and verify costs")
    costs = measure_costs(session, state, settings, reps, grid, max((max(r) for r in rows.values() if r), default=0))
    step_ms = measure_step_overhead(session, state, costs, default.tree, max_new_tokens, reps)
    ranked = choose(taus, costs["verify_ms"], costs["draft_ms"], costs["extend_ms"], rows, costs["lookup_ms"],
                    step_ms)
    by_setting = {setting_of(r): r for r in ranked}
    best, validation = ranked[0], None
    if validate > 0:
        best, validation = validate_finalists(session, encoded, max_new_tokens, ranked, by_setting.get(default),
                                              validate, validate_repeats, progress)
    verify = costs["verify_ms"]
    return {
        "best": best, "default": by_setting.get(default), "ranked": ranked, "validation": validation,
        "ar_predicted_tokens_per_second": 1e3 / interpolate(verify, 1),
        "measured": {"positions": state["positions"], "prompts": len(encoded), "max_new_tokens": max_new_tokens,
                     "threads": torch.get_num_threads(), "context_tokens": costs["context_tokens"],
                     "verify_ms": verify, "extend_ms": costs["extend_ms"], "step_overhead_ms": step_ms,
                     "draft_ms": {f"{k}x{d}": v for (k, d), v in costs["draft_ms"].items()},
                     "lookup_ms": {f"{t}x{b}+{ds}": v for (t, b, ds), v in costs["lookup_ms"].items()},
                     "lookup_grid": len(grid), "datastore": has_store,
                     "seconds": timing.now() - t0},
    }
