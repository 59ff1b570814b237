"""Time the CPU kernels: the numbers in docs/architecture.md and docs/bench.md come from these commands.

    python scripts/kernel_timings.py --threads 2                           # projections + attention, every kernel
    python scripts/kernel_timings.py --engine ENGINE --threads 2           # + the target forward over 1..32 tokens
    python scripts/kernel_timings.py --engine ENGINE --parts --threads 2   # one forward by parts at 1, 16, 17 rows
    python scripts/kernel_timings.py --engine ENGINE --parts --rows 1,2,3,4 --threads 2   # at the rows a short tree verifies
    python scripts/kernel_timings.py --peak --threads 2                    # the multiply-add peaks and copy bandwidth

--parts ends with each projection kind and the LM head against this machine's floors: its multiply-adds at the
measured peak of the instruction it computes with (csrc/madd_peak.cpp: fp32 fma, the bf16 dot, the int8 dot of this
ISA) and its weight bytes at the memory bandwidth (the better of a copy's and a read stream's); "at floor" is the floor over
the fastest time.
    EAGLE_TRT_ISA=avx2 python scripts/kernel_timings.py ...                # the AVX2 kernels on a bigger CPU

Times are in ms, the median over repeats and, in parentheses, the minimum (the machines here are shared: a repeat
that lost a core to another process shows in the median, rarely in the minimum); variants alternate within every
repeat. Scratch measurements: compare runs made back to back.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagle_trt.models import native
from eagle_trt.models.gemm import Projection, prepack_enabled
from eagle_trt.models.layers import attention, attention_fp64


class Timing(float):
    """Median seconds (the float's value), with the minimum beside it."""

    def __new__(cls, samples: list[float]):
        t = super().__new__(cls, statistics.median(samples))
        t.min = min(samples)
        return t

    def ms(self, scale: float = 1.0) -> str:
        return f"{self * 1e3 * scale:.3f} ({self.min * 1e3 * scale:.3f})"


def interleaved(cases: dict, reps: int) -> dict:
    """Timing of each zero-argument callable, all taking turns within every repeat."""
    times: dict = {}
    for _ in range(reps):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times.setdefault(name, []).append(time.perf_counter() - start)
    return {name: Timing(v) for name, v in times.items()}


def projections(reps: int) -> None:
    """30 distinct [576, 3072] weights (SmolLM2's gate_up) so nothing stays in cache; ms per call."""
    from eagle_trt.models.native.gemm import NativeProjection

    lib = native.library()
    print(f"projection [576 x 3072], ms per call, median (min) [weight GB/s at one row, from the min]; kernels: "
          f"{lib.isa_name if lib else 'none: ' + str(native.unavailable())}")
    for dtype in (torch.float32, torch.bfloat16):
        ws = [torch.randn(576, 3072).to(dtype) for _ in range(30)]
        kinds = {"x @ W": [Projection(w, prepack=False) for w in ws]}
        packed = [Projection(w, prepack=True) for w in ws] if prepack_enabled() else []
        if packed and packed[0].packed is not None:  # bf16: only where the CPU has hardware bf16
            kinds["oneDNN prepacked"] = packed
        if lib is not None:
            kinds["vector kernel"] = [NativeProjection(lib, w) for w in ws]
            if lib.isa_name == "amx" and dtype == torch.bfloat16:
                kinds["AMX kernel"] = [NativeProjection(lib, w, amx=True) for w in ws]
        for rows in (1, 16, 17, 32):
            x = torch.randn(rows, 576).to(dtype)
            calls = {name: (lambda ps=ps: [p(x) for p in ps]) for name, ps in kinds.items()}
            if "oneDNN prepacked" in kinds:  # the packed kernel itself, also for fp32 at one row
                calls["oneDNN prepacked"] = lambda ps=kinds["oneDNN prepacked"]: [p._packed(x) for p in ps]
            t = interleaved(calls, reps)
            gb = 576 * 3072 * ws[0].element_size() * 30 / 1e9
            cells = [f"{name} {t[name].ms(1 / 30)}" + (f" [{gb / t[name].min:.0f} GB/s]" if rows == 1 else "")
                     for name in calls]
            print(f"  {str(dtype):15} rows={rows:2}  " + "  ".join(cells))


def attentions(reps: int) -> None:
    lib = native.library()
    kernel = None
    if lib is not None:
        from eagle_trt.models.native.ops import Attention

        kernel = Attention(lib)
    print("attention of one layer (9 q heads, 3 kv heads, d=64), ms, median (min):")
    for dtype in (torch.float32, torch.bfloat16):
        for t, s in ((1, 300), (17, 300), (17, 1000), (16, 1024)):
            q, k, v = (torch.randn(9, t, 64).to(dtype), torch.randn(3, s, 64).to(dtype),
                       torch.randn(3, s, 64).to(dtype))
            mask = None if t == 1 else torch.ones(t, s, dtype=torch.bool)
            calls = {"sdpa": lambda: attention(q, k, v, mask), "float64": lambda: attention_fp64(q, k, v, mask)}
            if kernel is not None:
                calls["row-invariant kernel"] = lambda: kernel(q, k, v, mask)
            m = interleaved(calls, reps)
            print(f"  {str(dtype):15} T={t:2} S={s:4}  " + "  ".join(f"{n} {m[n].ms()}" for n in calls))


def _engine(engine: str):
    from eagle_trt.engine.engine_dir import open_engine
    from eagle_trt.runtime.session import DTYPES

    e = open_engine(engine, verify=False)
    return e, DTYPES[e.config.dtype]


def forward_curve(engine: str, reps: int) -> None:
    from eagle_trt.bench.roofline import forward_curve as curve
    from eagle_trt.models.llama import LlamaTarget

    e, dtype = _engine(engine)
    target = LlamaTarget.load(e.target_dir, dtype, block_compute=e.manifest.block_compute)
    c = curve(target, [1, 4, 8, 16, 32], context=200, reps=reps)
    print(f"target forward ({e.config.dtype}, {e.manifest.block_compute} blocks, kernels {target.kernels.name}, "
          "200 cached tokens), ms:")
    print("  " + "  ".join(f"T={t}: {s * 1e3:.1f}" for t, s in c.items()) + f"   16 vs 1: {c[16] / c[1]:.2f}x")


def forward_parts(engine: str, reps: int, context: int = 300, rows: tuple[int, ...] = (1, 16, 17)) -> None:
    """One target forward (as a verify pass: features, a causal mask) at each of `rows` tokens after `context` cached
    ones, beside its parts timed alone on the same shapes: the layers' projections (all of them, then each kind:
    qkv, o, gate_up, down), the attention of every layer, the greedy tokens (LM head + argmax); and the draft
    head's forward at 1, 2 and 5 rows."""
    from eagle_trt.models.draft_head import Eagle3DraftHead
    from eagle_trt.models.llama import LlamaTarget

    e, dtype = _engine(engine)
    target = LlamaTarget.load(e.target_dir, dtype, block_compute=e.manifest.block_compute)
    head = Eagle3DraftHead.load(e.draft_dir, target, dtype)
    target.aux_layer_ids = list(head.spec.aux_layer_ids)
    s, g = target.spec, torch.Generator().manual_seed(0)
    cache, hcache = target.new_cache(context + 20), head.new_cache(context + 20)
    target.forward(torch.randint(0, s.vocab_size, (context,), generator=g), torch.arange(context), cache)
    cache.length = hcache.length = context
    kinds = {k: [getattr(lw, k) for lw in target.layers] for k in ("qkv", "o", "gate_up", "down")}
    projs = [p for ps in kinds.values() for p in ps]
    calls = {}
    for t in rows:
        mask = torch.ones(t, t, dtype=torch.bool).tril_() if t > 1 else None
        full = torch.cat([torch.ones(t, context, dtype=torch.bool), mask], 1) if t > 1 else None
        tokens, pos = torch.arange(t) + 7, torch.arange(context, context + t)
        xs = {n: torch.randn(t, n, generator=g).to(dtype) for n in {p.in_features for p in projs}}
        q = torch.randn(s.num_heads, t, s.head_dim, generator=g).to(dtype)
        hidden = torch.randn(t, s.hidden_size, generator=g).to(dtype)
        kv = cache.read(0, context + t)
        calls[("target forward", t)] = lambda a=(tokens, pos, mask): target.hidden_states(a[0], a[1], cache, a[2],
                                                                                            need_aux=True)
        calls[("layer projections", t)] = lambda xs=xs: [p(xs[p.in_features]) for p in projs]
        for kind, ps in kinds.items():
            calls[(f"  {kind}", t)] = lambda xs=xs, ps=ps: [p(xs[p.in_features]) for p in ps]
        calls[("attention, every layer", t)] = lambda q=q, full=full, kv=kv: [
            target.kernels.attend(q, *kv, full) for _ in target.layers]
        calls[("greedy tokens", t)] = lambda h=hidden: target.greedy(h)
    for t in (1, 2, 5):
        feats = torch.randn(t, s.hidden_size, generator=g).to(dtype)
        m = torch.ones(t, context + t, dtype=torch.bool)
        calls[("draft head forward", t)] = lambda a=(feats, torch.arange(t) + 7, torch.full((t,), context), m): \
            head.forward(a[0], a[1], a[2], hcache, context, a[3])
    med = interleaved(calls, reps)
    print(f"{e.config.dtype} target ({e.manifest.block_compute} blocks), kernels {target.kernels.name}, "
          f"{context} cached tokens, {reps} repeats, ms, median (min):")
    for name in dict.fromkeys(n for n, _ in calls):
        print(f"  {name:23} " + "   ".join(f"T={t:2} {med[(n, t)].ms()}" for n, t in calls if n == name))
    part_floors(target, kinds, context, rows, med, dtype)


def machine_peaks(threads: int) -> tuple[dict[str, float], float]:
    """({"fp32", "bf16", "int8"}: G multiply-adds/s this build's instructions reach on `threads` threads (bf16: the
    AVX512-BF16 dot, else the fp32 rate bf16 weights compute at), copy bandwidth GB/s (read + write, best of 5))."""
    from eagle_trt.bench.roofline import copy_bandwidth

    lib = native.library()
    if lib is None:
        raise SystemExit(f"kernel_timings: no native kernels here: {native.unavailable()}")
    peak = {name: lib.madd_peak(kind, threads, 5) for kind, name in enumerate(("fp32", "bf16", "int8"))}
    if peak["bf16"] < 0:
        peak["bf16"] = peak["fp32"]
    return peak, max(copy_bandwidth(256), read_bandwidth(256)) / 1e9


def read_bandwidth(megabytes: int, reps: int = 5) -> float:
    """Bytes/s of the fastest of `reps` reads of a buffer (an int64 sum: a pass over the bytes, as a one-row
    projection makes over its weights)."""
    a = torch.ones(megabytes * (1 << 20) // 8, dtype=torch.int64)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - start)
    return a.numel() * 8 / best


def _kind(proj, dtype) -> str:
    """Which multiply-add a projection computes with: int8 blocks, the bf16 dot for bf16 weights, else fp32."""
    if getattr(proj, "compute", None) == "int8":
        return "int8"
    w = getattr(proj, "w", None)
    return "bf16" if dtype == torch.bfloat16 and getattr(w, "dtype", None) == torch.bfloat16 else "fp32"


def _bytes(proj) -> int:
    w = getattr(proj, "w", proj)
    return w.numel() * w.element_size()


def part_floors(target, kinds: dict, context: int, rows, med: dict, dtype) -> None:
    """Each projection kind, all projections and the LM head against this machine's floors at each row count: the
    multiply-adds at the measured peak of the instruction it computes with, and its weight bytes at the copy
    bandwidth (the better of a copy's read + write bytes and a read stream's). floor = the larger; "at" = floor / min
    time (over 100%: the part ran faster than that bandwidth, e.g. from cache)."""
    peak, bw = machine_peaks(torch.get_num_threads())
    print(f"peaks on {torch.get_num_threads()} threads: " + ", ".join(f"{k} {v:.0f} GMAC/s" for k, v in peak.items())
          + f"; memory bandwidth {bw:.1f} GB/s")
    parts = {f"  {k}": ps for k, ps in kinds.items()}
    parts["layer projections"] = [p for ps in kinds.values() for p in ps]
    parts["greedy tokens"] = [target.lm_head]
    print("  part                    T   min ms  floor ms (compute / memory)  at floor")
    for name, ps in parts.items():
        for t in rows:
            macs = {}
            for p in ps:
                macs[_kind(p, dtype)] = macs.get(_kind(p, dtype), 0) + t * p.in_features * p.out_features
            compute = sum(m / (peak[k] * 1e9) for k, m in macs.items()) * 1e3
            memory = sum(_bytes(p) for p in ps) / (bw * 1e9) * 1e3
            took = med[(name, t)].min * 1e3
            floor = max(compute, memory)
            print(f"  {name:23} {t:2} {took:8.3f}  {floor:8.3f} ({compute:.3f} / {memory:.3f})  "
                  f"{floor / took:6.0%}  [{'+'.join(sorted(macs))}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--engine", default=None, help="also time the engine's target forward over 1..32 tokens")
    ap.add_argument("--parts", action="store_true", help="with --engine: only one forward by parts (projections, "
                    "attention, LM head, draft head)")
    ap.add_argument("--rows", default="1,16,17", help="with --parts: the forward's row counts, comma-separated")
    ap.add_argument("--peak", action="store_true", help="only the multiply-add peaks and the copy bandwidth")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"threads {torch.get_num_threads()}, prepack {prepack_enabled()}")
    if args.peak:
        peak, bw = machine_peaks(torch.get_num_threads())
        print(", ".join(f"{k} {v:.1f} GMAC/s" for k, v in peak.items()) + f"; memory bandwidth {bw:.1f} GB/s")
        return
    torch.manual_seed(0)
    if args.parts:
        if not args.engine:
            raise SystemExit("--parts needs --engine")
        forward_parts(args.engine, args.repeats, rows=tuple(int(r) for r in args.rows.split(",")))
        return
    projections(args.repeats)
    attentions(args.repeats * 5)
    if args.engine:
        forward_curve(args.engine, args.repeats)


if __name__ == "__main__":
    main()
