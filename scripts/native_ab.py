"""What the compiled kernels buy end to end: the same engine, prompts and settings, decoded with each kernel set,
interleaved prompt by prompt in one process (the machine's speed drifts, so only side-by-side numbers mean anything).

    python scripts/native_ab.py --engine engines/smollm2-135m-eagle3-bf16 --prompts humaneval --limit 6
    python scripts/native_ab.py --engine E --variants torch-ops,float64     # two of them

Variants (bf16 engines; each adds one kernel to the one after it):
    native     the engine's default: projections on AMX tiles, fused row ops, row-invariant attention kernel
    no-amx     oneDNN projections, fused row ops, attention kernel
    torch-ops  oneDNN projections, torch's row ops, attention kernel
    float64    oneDNN projections, torch's row ops, float64 attention (the engine without a C++ compiler)
fp32 engines: `kernel` (the attention kernel) and `sdpa` (torch's, the engine's default there).

Prints, per variant: plain AR and the engine's (tuned) speculative setting in tok/s, their ratio, and how many
speculative outputs differed from AR (must be 0 for bf16; fp32's SDPA rows may differ from decoding in the last
bit, so the kernel runs there only for this comparison).
"""

from __future__ import annotations

from decode_setup import decode_parser, open_session

BF16_VARIANTS = ("native", "no-amx", "torch-ops", "float64")
FP32_VARIANTS = ("kernel", "sdpa")


def main() -> None:
    ap = decode_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--variants", default=None, help="comma-separated, from the list above (default: all)")
    args = ap.parse_args()

    import torch

    from eagle_trt.models import native_attention, native_gemm
    from eagle_trt.models.layers import attention, attention_fp64
    from eagle_trt.runtime.session import Session

    kernel = native_attention.load()
    if kernel is None:
        raise SystemExit("the kernels are unavailable here (need a C++ compiler and EAGLE_TRT_NATIVE unset)")
    session, prompts = open_session(args)
    bf16 = session.runner.target.dtype == torch.bfloat16
    known = BF16_VARIANTS if bf16 else FP32_VARIANTS
    names = args.variants.split(",") if args.variants else list(known)
    if bad := [n for n in names if n not in known]:
        raise SystemExit(f"unknown variant(s) {bad} for this engine; choose from {', '.join(known)}")
    plain = session
    if bf16 and set(names) - {"native"}:
        # Projections pick their kernel when the weights load: a second copy of the engine without AMX.
        amx_load = native_gemm.load
        native_gemm.load = lambda: None
        try:
            plain = Session.open(args.engine)
        finally:
            native_gemm.load = amx_load
    ops = session.runner.target.row_ops
    # name -> (session, attention, row ops)
    table = {"native": (session, kernel, ops), "no-amx": (plain, kernel, ops), "torch-ops": (plain, kernel, None),
             "float64": (plain, attention_fp64, None), "kernel": (session, kernel, None),
             "sdpa": (session, attention, None)}
    variants = {n: table[n] for n in names}
    spec = session.decode_options(max_new_tokens=args.max_new_tokens)
    ar = session.decode_options(mode="ar", max_new_tokens=args.max_new_tokens)
    totals = {name: [0.0, 0.0, 0, 0, 0] for name in variants}  # ar s, spec s, ar tokens, spec tokens, mismatches
    for _ in range(args.repeats):
        for ids in prompts:
            for name, (sess, attend, row_ops) in variants.items():
                runner = sess.runner
                runner.target.attend, runner.target.row_ops = attend, row_ops
                a, b = runner.generate(ids, ar), runner.generate(ids, spec)
                t = totals[name]
                t[0] += a.metrics.total_s
                t[1] += b.metrics.total_s
                t[2] += len(a.token_ids)
                t[3] += len(b.token_ids)
                t[4] += a.token_ids != b.token_ids
    for name, (ta, tb, na, nb, bad) in totals.items():
        print(f"{name:10} ar {na / ta:5.1f} tok/s   speculative {nb / tb:5.1f} tok/s   ratio {nb / tb / (na / ta):.2f}x"
              f"   outputs differing from ar: {bad}")


if __name__ == "__main__":
    main()
