"""Reproduce the CPU-kernel timings quoted in models/gemm.py and docs/architecture.md.

    python scripts/kernel_timings.py --threads 2                        # projections + attention
    python scripts/kernel_timings.py --engine engines/smollm2-135m-eagle3 --threads 2   # + target forward curve
    EAGLE_TRT_PREPACK=0 python scripts/kernel_timings.py --engine ...   # forward curve without prepacking
    python scripts/kernel_timings.py --engine ENGINE --parts --threads 2  # where 1 -> 17 rows adds time
    python scripts/kernel_timings.py --engine ENGINE --calls --threads 2  # one-call paths vs the Python ones

Times are medians over repeats, in ms. Scratch measurements: compare runs made back to back.
"""

from __future__ import annotations

import argparse

import torch

from eagle_trt.bench.stats import median_seconds
from eagle_trt.models.gemm import Projection, prepack_enabled
from eagle_trt.models import native_attention, native_gemm
from eagle_trt.models.layers import attention, attention_fp64


def projections(reps: int) -> None:
    """30 distinct [576, 3072] weights (SmolLM2's gate_up) so nothing stays in cache; ms per call."""
    print("projection [576 x 3072], ms per call:")
    amx = native_gemm.load()
    for dtype in (torch.float32, torch.bfloat16):
        ws = [torch.randn(576, 3072).to(dtype) for _ in range(30)]
        plain = [Projection(w, prepack=False) for w in ws]
        packed = [Projection(w, prepack=True, amx=False) for w in ws] if prepack_enabled() else None
        tiles = [amx.pack(w) for w in ws] if amx is not None and dtype == torch.bfloat16 else None
        for rows in (1, 16, 17, 32):
            x = torch.randn(rows, 576).to(dtype)
            line = f"  {str(dtype):15} rows={rows:2}  x @ W {median_seconds(lambda: [x @ p.w for p in plain], reps) / 30 * 1e3:.3f}"
            if packed:
                # Time the packed kernel itself, also for fp32 at one row (Projection would route that to x @ W).
                ms = median_seconds(lambda: [p._packed(x) for p in packed], reps) / 30 * 1e3
                line += f"  oneDNN prepacked {ms:.3f}"
            if tiles:
                line += f"  AMX kernel {median_seconds(lambda: [amx(x, t, 3072) for t in tiles], reps) / 30 * 1e3:.3f}"
            print(line)


def attentions(reps: int) -> None:
    print("attention of one layer (9 q heads, 3 kv heads, d=64), bf16, ms:")
    for t, s in ((1, 300), (17, 300), (17, 1000)):
        q, k, v = torch.randn(9, t, 64).bfloat16(), torch.randn(3, s, 64).bfloat16(), torch.randn(3, s, 64).bfloat16()
        mask = None if t == 1 else torch.ones(t, s, dtype=torch.bool)
        sdpa = median_seconds(lambda: attention(q, k, v, mask), reps) * 1e3
        fp64 = median_seconds(lambda: attention_fp64(q, k, v, mask), reps) * 1e3
        conv = median_seconds(lambda: (k.double(), v.double()), reps) * 1e3
        kernel = native_attention.load()
        native = f"  row-invariant kernel {median_seconds(lambda: kernel(q, k, v, mask), reps) * 1e3:.3f}" if kernel else ""
        print(f"  T={t:2} S={s:4}  sdpa {sdpa:.3f}  float64 {fp64:.3f}  K/V to float64 {conv:.3f}{native}")


def forward_curve(engine: str, reps: int) -> None:
    from eagle_trt.bench.roofline import forward_curve as curve
    from eagle_trt.models.llama import LlamaTarget
    from eagle_trt.runtime.session import DTYPES
    from eagle_trt.engine.engine_dir import open_engine

    e = open_engine(engine, verify=False)
    target = LlamaTarget.load(e.target_dir, DTYPES[e.config.dtype])
    c = curve(target, [1, 4, 8, 16, 32], context=200, reps=reps)
    print(f"target forward ({e.config.dtype}, 200 cached tokens), ms:")
    print("  " + "  ".join(f"T={t}: {s * 1e3:.1f}" for t, s in c.items()) + f"   16 vs 1: {c[16] / c[1]:.2f}x")


def forward_parts(engine: str, reps: int, context: int = 300) -> None:
    """The target forward at 1 and 17 tokens after `context` cached ones: with the fused row ops (bf16, where the
    engine has them), then on torch's row ops with the engine's attention, with float64 attention, and with
    attention replaced by zeros (the rest of the layer), beside the layers' projections alone (same weights, same rows): what the extra rows of a verify pass cost, part by part.
    Variants interleave within each repeat; medians in ms."""
    import statistics
    import time

    from eagle_trt.models.llama import LlamaTarget
    from eagle_trt.runtime.session import DTYPES
    from eagle_trt.engine.engine_dir import open_engine

    e = open_engine(engine, verify=False)
    target = LlamaTarget.load(e.target_dir, DTYPES[e.config.dtype])
    s = target.spec
    cache = target.new_cache(context + 18)
    g = torch.Generator().manual_seed(0)
    target.forward(torch.randint(0, s.vocab_size, (context,), generator=g), torch.arange(context), cache)
    cache.length = context

    def zeros(q, k, v, mask):
        return q.new_zeros(q.shape[1], q.shape[0] * q.shape[2])

    # (attention, row ops): the engine's attention and its fused row ops where it has them (bf16 with a compiler),
    # then each attention with torch's row ops.
    variants = {"torch row ops": (target.attend, None), "torch ops, fp64 attn": (attention_fp64, None),
                "torch ops, zero attn": (zeros, None)}
    if target.row_ops is not None:
        variants = {"engine (fused ops)": (target.attend, target.row_ops), **variants}
    projections = [p for lw in target.layers for p in (lw.qkv, lw.o, lw.gate_up, lw.down)]
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(reps):
        for t in (1, 17):
            tokens = torch.randint(0, s.vocab_size, (t,), generator=g)
            positions = torch.arange(context, context + t)
            mask = torch.ones(t, t, dtype=torch.bool).tril_() if t > 1 else None
            for name, (attend, row_ops) in variants.items():
                target.attend, target.row_ops = attend, row_ops
                start = time.perf_counter()
                target.hidden_states(tokens, positions, cache, mask)
                times.setdefault((name, t), []).append(time.perf_counter() - start)
            xs = {n: torch.randn(t, n, generator=g).to(target.dtype) for n in {p.w.shape[0] for p in projections}}
            start = time.perf_counter()
            for p in projections:
                p(xs[p.w.shape[0]])
            times.setdefault(("projections alone", t), []).append(time.perf_counter() - start)
    target.attend, target.row_ops = variants[next(iter(variants))]
    print(f"target forward parts ({e.config.dtype}, {context} cached tokens, median of {reps}), ms:")
    for name in (*variants, "projections alone"):
        one, many = (statistics.median(times[(name, t)]) * 1e3 for t in (1, 17))
        print(f"  {name:21} T=1 {one:6.1f}   T=17 {many:6.1f}   +{many - one:.1f}")


def native_calls(engine: str, reps: int, context: int = 300) -> None:
    """What the one-call paths buy (bf16 engine with AMX kernels), each against the Python path it replaces, in
    turns within every repeat: the target forward (decoder stack in one call vs the layer loop), the draft head
    (one call vs its fused ops from Python), the greedy tokens (LM head fused with the argmax vs logits + argmax)."""
    import statistics
    import time

    from eagle_trt.engine.engine_dir import open_engine
    from eagle_trt.models.draft_head import Eagle3DraftHead
    from eagle_trt.models.llama import LlamaTarget

    e = open_engine(engine, verify=False)
    target = LlamaTarget.load(e.target_dir, torch.bfloat16)
    head = Eagle3DraftHead.load(e.draft_dir, target, torch.bfloat16)
    if target.stack is None or head.layer is None:
        raise SystemExit("--calls needs a bf16 engine on a CPU with AMX and a C++ compiler")
    s = target.spec
    target.aux_layer_ids = list(head.spec.aux_layer_ids)
    g = torch.Generator().manual_seed(0)
    cache = target.new_cache(context + 20)
    target.forward(torch.randint(0, s.vocab_size, (context,), generator=g), torch.arange(context), cache)
    cache.length = context
    hcache = head.new_cache(context + 20)
    head.forward(torch.randn(context, s.hidden_size, generator=g).bfloat16(),
                 torch.randint(0, s.vocab_size, (context,), generator=g), torch.arange(context), hcache, 0)
    hcache.length = context
    stack, layer = target.stack, head.layer

    def forward(t, on):
        target.stack = stack if on else None
        mask = torch.ones(t, t, dtype=torch.bool).tril_() if t > 1 else None
        target.hidden_states(torch.arange(t) + 7, torch.arange(context, context + t), cache, mask, need_aux=True)

    def draft(t, on):
        head.layer = layer if on else None
        head.forward(torch.ones(t, s.hidden_size, dtype=torch.bfloat16), torch.arange(t) + 7,
                     torch.full((t,), context), hcache, context, torch.ones(t, context + t, dtype=torch.bool))

    hidden = {t: torch.randn(t, s.hidden_size, generator=g).bfloat16() for t in (1, 16)}

    def greedy(t, on):
        return target.greedy(hidden[t]) if on else target.argmax(target.logits(hidden[t]))

    cases = [("target forward", forward, (1, 16, 17)), ("draft head forward", draft, (1, 2, 5)),
             ("greedy tokens", greedy, (1, 16))]
    times: dict = {}
    for _ in range(reps):
        for name, fn, rows in cases:
            for t in rows:
                for on in (False, True):
                    start = time.perf_counter()
                    fn(t, on)
                    times.setdefault((name, t, on), []).append(time.perf_counter() - start)
    target.stack, head.layer = stack, layer
    print(f"one call vs the Python path ({context} cached tokens, median of {reps}), ms:")
    for name, _, rows in cases:
        for t in rows:
            py, one = (statistics.median(times[(name, t, on)]) * 1e3 for on in (False, True))
            print(f"  {name:19} T={t:2}  Python {py:6.2f}   one call {one:6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--engine", default=None, help="also time the engine's target forward over 1..32 tokens")
    ap.add_argument("--parts", action="store_true", help="with --engine: only the forward's parts at 1 and 17 "
                    "tokens (the engine; torch's row ops with its / float64 / zero attention; projections alone)")
    ap.add_argument("--calls", action="store_true", help="with --engine (bf16): only the one-call paths against the "
                    "Python paths they replace (target forward, draft head, greedy tokens)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"threads {torch.get_num_threads()}, prepack {prepack_enabled()}")
    torch.manual_seed(0)
    if args.calls:
        if not args.engine:
            raise SystemExit("--calls needs --engine")
        native_calls(args.engine, args.repeats)
        return
    if args.parts:
        if not args.engine:
            raise SystemExit("--parts needs --engine")
        forward_parts(args.engine, args.repeats)
        return
    projections(args.repeats)
    attentions(args.repeats * 5)
    if args.engine:
        forward_curve(args.engine, args.repeats)


if __name__ == "__main__":
    main()
