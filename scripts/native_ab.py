"""What the compiled kernels buy end to end: the same engine, prompts and settings, decoded on each backend,
interleaved prompt by prompt in one process (the machine's speed drifts, so only side-by-side numbers mean anything).

    python scripts/native_ab.py --engine engines/smollm2-135m-eagle3-bf16 --prompts humaneval --limit 6
    python scripts/native_ab.py --engine E --variants native,avx2     # two of them

Variants (each a copy of the engine loaded on that backend, `models/kernels.py`):
    native   the backend the engine chooses here (amx, avx512 or avx2)
    avx2     the AVX2 + FMA build of the kernels (`-march=x86-64-v3`), on a CPU above AVX2
    vectors  on an AMX CPU, a bf16 engine's projections on the vector kernel instead of the tiles
    torch    the torch reference (the engine without a C++ compiler)

Prints, per variant: plain AR and the engine's (tuned) speculative setting in tok/s, their ratio, and how many
speculative outputs differed from AR (must be 0 wherever the backend is row-invariant: every one but torch fp32).
"""

from __future__ import annotations

from decode_setup import decode_parser, open_session


def backends(dtype) -> dict:
    """name -> backend for every variant this machine runs."""
    from eagle_trt.models import native
    from eagle_trt.models.native import bindings, build
    from eagle_trt.models.native.kernels import NativeKernels
    from eagle_trt.models.reference import TorchKernels

    out = {}
    lib = native.library()
    if lib is not None:
        out["native"] = None  # the engine's own choice
        if lib.isa_name != "avx2":
            out["avx2"] = NativeKernels(bindings.Library(build.build(target_isa="avx2")), dtype)
        if lib.isa_name == "amx":
            out["vectors"] = NativeKernels(lib, dtype, amx=False)
    out["torch"] = TorchKernels(dtype)
    return out


def open_on(engine: str, backend):
    """The engine opened with its target (and head) on `backend` (None: the engine's own choice)."""
    from eagle_trt.models import llama
    from eagle_trt.runtime.session import Session

    if backend is None:
        return Session.open(engine)
    chosen = llama.choose_kernels
    llama.choose_kernels = lambda *a, **k: backend
    try:
        return Session.open(engine)
    finally:
        llama.choose_kernels = chosen


def main() -> None:
    ap = decode_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--variants", default=None, help="comma-separated, from the list above (default: all)")
    args = ap.parse_args()

    session, prompts = open_session(args)
    known = backends(session.runner.target.dtype)
    names = args.variants.split(",") if args.variants else list(known)
    if bad := [n for n in names if n not in known]:
        raise SystemExit(f"unknown or unavailable variant(s) {bad} here; choose from {', '.join(known)}")
    sessions = {n: session if known[n] is None else open_on(args.engine, known[n]) for n in names}
    spec = session.decode_config(max_new_tokens=args.max_new_tokens)
    ar = session.decode_config(mode="ar", max_new_tokens=args.max_new_tokens)
    totals = {name: [0.0, 0.0, 0, 0, 0] for name in names}  # ar s, spec s, ar tokens, spec tokens, mismatches
    for _ in range(args.repeats):
        for ids in prompts:
            for name, sess in sessions.items():
                a, b = sess.runner.generate(ids, ar), sess.runner.generate(ids, spec)
                t = totals[name]
                t[0] += a.metrics.total_s
                t[1] += b.metrics.total_s
                t[2] += len(a.token_ids)
                t[3] += len(b.token_ids)
                t[4] += a.token_ids != b.token_ids
    for name, (ta, tb, na, nb, bad) in totals.items():
        kernels = sessions[name].kernels
        print(f"{name:8} ({kernels:6}) ar {na / ta:5.1f} tok/s   speculative {nb / tb:5.1f} tok/s   "
              f"ratio {nb / tb / (na / ta):.2f}x   outputs differing from ar: {bad}")


if __name__ == "__main__":
    main()
