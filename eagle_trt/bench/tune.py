"""`eagle-trt tune`: pick the dynamic-tree settings that maximize expected tokens/s on this machine.

Expected tokens/s of a setting (beam width k, depth d, total tokens N) is

    tau(k, d, N) / (draft(k, d) + extend(tau) + verify(N + 1))

where verify(T) is the measured target forward over T tokens (the verify-cost curve), draft(k, d) the
measured time to grow a tree, extend(n) the measured time to feed n accepted tokens back to the head,
and tau the head's acceptance measured by replay: the target's greedy continuation of some calibration
prompts is known (plain AR decoding), so at sampled positions the drafter grows one large tree per beam
width and every (d, N) sub-tree of it is scored against that continuation exactly as greedy
verification would (a dynamic tree of depth d and size N keeps the N best-scored candidates up to depth
d, so it is a sub-tree of the deeper one).

The model leaves out per-step work it does not time (tree bookkeeping, mask building, KV compaction, token
emission), the plain-decoding fallback after repeated misses and the prompt-lookup branch, so the few
best-predicted settings and the build default are then *run* on the calibration prompts, each with the
fallback on and off and (with --lookup-tokens > 0) prompt lookup off and on, interleaved over repeats
(`measure_end_to_end`), and the variant with the best measured tokens/s wins.
The same runs check every speculative output against plain AR decoding.

The choice (`choose`) is a pure function of those measurements and is unit-tested on synthetic curves;
`store_tuned` writes tuned.json into the engine and re-lists it in manifest.json with its sha256.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from eagle_trt.bench.stats import interpolate, median_seconds

TOTALS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)


@dataclass(frozen=True, order=True)
class Setting:
    beam_width: int
    draft_length: int
    total_tokens: int


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


def predict_tps(tau: float, draft_ms: float, extend_ms: float, verify_ms: float) -> float:
    step = draft_ms + extend_ms + verify_ms
    return 1e3 * tau / step if step > 0 else 0.0


def choose(taus: dict[Setting, float], verify_ms: dict[int, float], draft_ms: dict[tuple[int, int], float],
           extend_ms: dict[int, float]) -> list[dict]:
    """Rank settings by predicted tokens/s (best first; ties go to the smaller tree).

    taus: measured tau per setting; verify_ms: forward ms per token count (root included);
    draft_ms: tree-growing ms per (beam width, depth); extend_ms: head-update ms per accepted count."""
    ranked = []
    for s, tau in taus.items():
        if (s.beam_width, s.draft_length) not in draft_ms:
            continue
        v = interpolate(verify_ms, s.total_tokens + 1)
        e = interpolate(extend_ms, tau)
        d = draft_ms[(s.beam_width, s.draft_length)]
        ranked.append({**asdict(s), "tau": tau, "draft_ms": d, "extend_ms": e, "verify_ms": v,
                       "predicted_tokens_per_second": predict_tps(tau, d, e, v)})
    ranked.sort(key=lambda r: (-r["predicted_tokens_per_second"], r["total_tokens"], r["beam_width"],
                               r["draft_length"]))
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


def calibrate(session, encoded: list[list[int]], max_new_tokens: int, positions: int, settings: list[Setting],
              progress: Callable[[str], None] | None = None) -> tuple[dict[Setting, float], dict]:
    """Measured tau per setting by replay over the calibration prompts; also returns one drafter state
    (prefix length, root, sequence) for the timing measurements."""
    runner = session.runner
    max_depth = max(s.draft_length for s in settings)
    sums = {s: 0 for s in settings}
    count = 0
    state = None
    for i, ids in enumerate(encoded):
        ar = runner.generate(ids, session.decode_options(mode="ar", max_new_tokens=max_new_tokens, tuned=False))
        seq = list(ids) + ar.token_ids
        last = len(seq) - 1 - max_depth  # the last root with a full continuation behind it
        if last < len(ids):
            continue
        roots = sorted({round(len(ids) + j * (last - len(ids)) / max(positions - 1, 1)) for j in range(positions)})
        per_root, state = replay(session, seq, roots, settings)  # the last prompt's state stays usable
        for res in per_root.values():
            for s, acc in res.items():
                sums[s] += acc
        count += len(per_root)
        if progress:
            progress(f"calibration prompt {i + 1}/{len(encoded)}: {len(roots)} positions")
    if count == 0:
        from eagle_trt.errors import InputError

        raise InputError("no calibration position: the prompts' AR outputs are shorter than the tree depth",
                         hint="raise --max-new-tokens or lower --max-depth")
    return {s: 1 + v / count for s, v in sums.items()}, {**state, "positions": count}


def measure_costs(session, state: dict, settings: list[Setting], reps: int = 3) -> dict:
    """draft ms per (k, d), extend ms per accepted count, verify ms per tree size (all medians)."""
    from eagle_trt.bench.roofline import default_sizes, forward_curve

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
    at_root()
    max_tree = max(s.total_tokens for s in settings) + 1
    context = n
    verify = {t: s * 1e3 for t, s in forward_curve(runner.target, default_sizes(max_tree), context, reps).items()}
    return {"draft_ms": draft, "extend_ms": extend, "verify_ms": verify, "context_tokens": context}


def finalists(ranked: list[dict], default: dict | None, n: int) -> list[Setting]:
    """The n best-predicted settings plus the build default (no duplicates), in ranking order."""
    picked = [Setting(r["beam_width"], r["draft_length"], r["total_tokens"]) for r in ranked[:max(n, 0)]]
    if default is not None:
        picked.append(Setting(default["beam_width"], default["draft_length"], default["total_tokens"]))
    return list(dict.fromkeys(picked))


def variant_name(fallback_after: int, lookup_tokens: int, lookup_branches: int) -> str:
    return f"fallback{fallback_after}/lookup{lookup_tokens}x{lookup_branches if lookup_tokens else 0}"


def measure_end_to_end(session, encoded: list[list[int]], max_new_tokens: int, settings: list[Setting],
                       repeats: int = 2, variants: tuple[tuple[int, int, int], ...] = ((2, 0, 1),)) -> dict:
    """Decode every calibration prompt with plain AR and with each dynamic-tree setting, once per variant
    (fallback_after, lookup_tokens, lookup_branches) — DecodeOptions.fallback_after: plain decoding after that
    many verify steps in a row accept nothing (0 = never); lookup_*: the prompt-lookup branches (0 tokens =
    off) — through the bench harness: same interleaving, tokens/s and AR check as `bench`.

    Returns {"ar": tok/s (median), "variants": {(Setting, *variant): {"tokens_per_second", "tau"}},
    "mismatches": [(Setting, *variant), ...]}; a mismatch is a variant whose output differs from AR on some
    prompt (a lossless-ness failure)."""
    from eagle_trt.bench.harness import run_bench
    from eagle_trt.bench.methods import OursMethod
    from eagle_trt.bench.prompts import Prompt

    runs = {f"{s.beam_width}x{s.draft_length}x{s.total_tokens}/{variant_name(*v)}": (s, *v)
            for s in settings for v in dict.fromkeys(variants)}
    methods = [OursMethod("ar", session.runner, session.decode_options(mode="ar", tuned=False))]
    methods += [OursMethod(name, session.runner, session.decode_options(
        tree="dynamic", beam_width=s.beam_width, draft_length=s.draft_length, total_tokens=s.total_tokens,
        fallback_after=f, lookup_tokens=lk, lookup_branches=br, tuned=False)) for name, (s, f, lk, br) in runs.items()]
    prompts = [(Prompt(id=f"calibration-{i}", category="calibration"), ids) for i, ids in enumerate(encoded)]
    res = run_bench(methods, prompts, max_new_tokens, repeats, warmup=False,
                    references={name: ("ar", True) for name in runs})
    summary = res["summary"]
    return {"ar": summary["ar"]["tokens_per_second"]["median"],
            "variants": {v: {"tokens_per_second": summary[name]["tokens_per_second"]["median"],
                             "tau": summary[name]["acceptance_length"]} for name, v in runs.items()},
            "mismatches": sorted({runs[c["method"]] for c in res["failures"]})}


def end_to_end_variants(lookup_tokens: int, lookup_branches: int = 1) -> tuple[tuple[int, int, int], ...]:
    """(fallback_after, lookup_tokens, lookup_branches) each finalist runs with: the fallback on and off, and
    with lookup_tokens > 0 the prompt-lookup branches off and on."""
    fallbacks = tuple(dict.fromkeys((default_fallback(), 0)))
    lookups = ((0, 1),) + (((lookup_tokens, max(lookup_branches, 1)),) if lookup_tokens > 0 else ())
    return tuple((f, lk, br) for lk, br in lookups for f in fallbacks)


def default_fallback() -> int:
    from eagle_trt.runtime.runner import DecodeOptions

    return DecodeOptions.__dataclass_fields__["fallback_after"].default


def tree_room(cfg) -> int:
    """Largest total_tokens / beam*depth the engine's KV cache reserves room for (see Session.open)."""
    return max(cfg.total_tokens, cfg.max_beam_width * cfg.draft_length, 64)


def tune_engine(session, encoded: list[list[int]], max_new_tokens: int = 64, positions: int = 16,
                max_depth: int = 8, beams: list[int] | None = None, reps: int = 3,
                progress: Callable[[str], None] | None = None, validate: int = 3, validate_repeats: int = 2,
                lookup_tokens: int = 0, lookup_branches: int = 1) -> dict:
    """Measure everything and rank the settings; returns {"best", "default", "ranked", "measured", ...}.

    With validate > 0 the `validate` best-predicted settings and the build default are run end to end
    (`measure_end_to_end`) and "best" is the fastest of them as measured; every ranked row of a finalist
    gains "measured_tokens_per_second" and "measured_tau", and the result "validation". Each finalist runs
    with the plain-decoding fallback on and off and, with lookup_tokens > 0, with the prompt-lookup branch
    off and on (`end_to_end_variants`); its fastest variant counts."""
    cfg = session.config
    default = Setting(cfg.max_beam_width, cfg.draft_length, cfg.total_tokens)
    beams = sorted({b for b in (beams or [1, 2, 4, 8]) if 1 <= b <= cfg.max_beam_width} | {cfg.max_beam_width})
    max_depth = min(max(max_depth, cfg.draft_length), 32)
    settings = candidate_settings(beams, max_depth, tree_room(cfg), include=[default])
    t0 = time.perf_counter()
    taus, state = calibrate(session, encoded, max_new_tokens, positions, settings, progress)
    if progress:
        progress("measuring draft, head-update and verify costs")
    costs = measure_costs(session, state, settings, reps)
    ranked = choose(taus, costs["verify_ms"], costs["draft_ms"], costs["extend_ms"])
    by_setting = {Setting(r["beam_width"], r["draft_length"], r["total_tokens"]): r for r in ranked}
    best, validation = ranked[0], None
    if validate > 0:
        picked = finalists(ranked, by_setting.get(default), validate)
        variants = end_to_end_variants(lookup_tokens, lookup_branches)
        if progress:
            progress(f"running {len(picked)} finalists x {len(variants)} variants (fallback on/off"
                     f"{', prompt lookup off/on' if lookup_tokens > 0 else ''}) and plain AR end to end "
                     f"({validate_repeats} repeats)")
        measured = measure_end_to_end(session, encoded, max_new_tokens, picked, validate_repeats, variants)
        for s in picked:
            row = by_setting[s]
            per = {v: measured["variants"][(s, *v)] for v in variants}
            fb, lk, br = max(variants, key=lambda v: per[v]["tokens_per_second"])
            row["measured_tokens_per_second"] = per[(fb, lk, br)]["tokens_per_second"]
            row["measured_tau"] = per[(fb, lk, br)]["tau"]
            row["fallback_after"], row["lookup_tokens"], row["lookup_branches"] = fb, lk, br
            row["measured_by_variant"] = {variant_name(*v): round(m["tokens_per_second"], 3) for v, m in per.items()}
        best = by_setting[max(picked, key=lambda s: by_setting[s]["measured_tokens_per_second"])]
        validation = {"ar_tokens_per_second": measured["ar"], "repeats": validate_repeats,
                      "finalists": [by_setting[s] for s in picked],
                      "mismatches": [{**asdict(s), "fallback_after": fb, "lookup_tokens": lk, "lookup_branches": br}
                                     for s, fb, lk, br in measured["mismatches"]]}
    verify = costs["verify_ms"]
    return {
        "best": best, "default": by_setting.get(default), "ranked": ranked, "validation": validation,
        "ar_predicted_tokens_per_second": 1e3 / interpolate(verify, 1),
        "measured": {"positions": state["positions"], "prompts": len(encoded), "max_new_tokens": max_new_tokens,
                     "threads": torch.get_num_threads(), "context_tokens": costs["context_tokens"],
                     "verify_ms": verify, "extend_ms": costs["extend_ms"],
                     "draft_ms": {f"{k}x{d}": v for (k, d), v in costs["draft_ms"].items()},
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
    if "fallback_after" in best:
        data["fallback_after"] = int(best["fallback_after"])
        data["lookup_tokens"] = int(best.get("lookup_tokens", 0))
        data["lookup_branches"] = int(best.get("lookup_branches", 1))
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
