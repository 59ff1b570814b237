"""Two builds of the compiled kernels side by side: this checkout's and another git revision's.

    python scripts/kernel_ab.py --engine engines/smollm2-135m-eagle3-bf16 --base HEAD~1 --threads 2

The base revision's `eagle_trt/models/csrc` is compiled with the same compiler and flags into a temporary directory;
both libraries are loaded into this process and timed alternately, repeat by repeat, on the same inputs:

- every layer projection of the engine's target (its packed weights; the packing is the same in both builds) at
  several row counts;
- one attention layer (the target's head shape) at several query rows and cached tokens.

It prints the medians in ms and checks that both builds give the same bits (a kernel change that is meant to keep
them must). Machines here drift within minutes, so only the side-by-side ratio means much.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from eagle_trt.models import native, native_attention, native_gemm


def build_revision(rev: str, out_dir: Path) -> Path:
    """Compile revision `rev`'s kernels (the files in its csrc/) into out_dir; returns the library path."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    rel = native.CSRC.relative_to(root)
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{rel}"], capture_output=True, text=True,
                           cwd=root)
    if names.returncode != 0:
        raise SystemExit(f"kernel_ab: cannot read {rel} at revision {rev!r}: {names.stderr.strip()}")
    src = out_dir / "csrc"
    src.mkdir()
    for name in names.stdout.split():
        (src / name).write_bytes(subprocess.run(["git", "show", f"{rev}:{rel}/{name}"], capture_output=True,
                                                check=True, cwd=root).stdout)
    lib = out_dir / "base.so"
    cmd = [native._compiler() or "g++", *native.FLAGS, *map(str, sorted(src.glob("*.cpp"))), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"kernel_ab: building {rev} failed: {proc.stderr.strip()[-2000:]}")
    return lib


def gemm_of(lib: ctypes.CDLL):
    """The projection kernel of a library build, called as native_gemm.AmxGemm is (older builds lack the rest)."""
    fn = lib.eagle_trt_amx_gemm
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes, fn.restype = [ptr, ptr, ptr, i64, i64, i64, ctypes.c_int], ctypes.c_int

    def gemm(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
        out = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        if fn(x.data_ptr(), packed.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], n, torch.get_num_threads()):
            raise RuntimeError("base projection kernel failed")
        return out

    return gemm


def alternate(cases: dict, kernels: dict, reps: int, inner: int) -> dict:
    """Median seconds per (kernel name, case): the kernels take turns within every repeat, in reversed order every
    other repeat (the second of two back-to-back runs was seen 1-2% slower with identical code)."""
    times: dict = {}
    for rep in range(reps):
        for case, args in cases.items():
            for name, fn in (list(kernels.items()) if rep % 2 == 0 else list(kernels.items())[::-1]):
                start = time.perf_counter()
                for _ in range(inner):
                    fn(*args)
                times.setdefault((name, case), []).append((time.perf_counter() - start) / inner)
    return {key: statistics.median(v) for key, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, help="a bf16 engine (its target's weights and head shape)")
    ap.add_argument("--base", required=True, help="git revision to compare this checkout with")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rows", default="1,8,12,16,17,120", help="projection row counts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from eagle_trt.engine.engine_dir import open_engine
    from eagle_trt.models.llama import LlamaTarget

    new_gemm, new_att = native_gemm.load(), native_attention.load()
    if new_gemm is None or new_att is None:
        raise SystemExit("kernel_ab: this machine has no AMX kernels (or no compiler) to compare")
    with tempfile.TemporaryDirectory() as tmp:
        lib = ctypes.CDLL(str(build_revision(args.base, Path(tmp))))
        if lib.eagle_trt_amx_available() != 1:
            raise SystemExit("kernel_ab: the base build has no AMX kernel here")
        old_gemm, old_att = gemm_of(lib), native_attention.NativeAttention(lib)
        target = LlamaTarget.load(open_engine(args.engine, verify=False).target_dir, torch.bfloat16)
        projs = [p for lw in target.layers for p in (lw.qkv, lw.o, lw.gate_up, lw.down)]
        g = torch.Generator().manual_seed(0)
        print(f"threads {args.threads}, base {args.base}; medians of {args.repeats}, ms")

        rows = [int(r) for r in args.rows.split(",")]
        xs = {m: {n: torch.randn(m, n, generator=g).bfloat16() for n in {p.w.shape[0] for p in projs}} for m in rows}

        def layers(kernel, m):
            return [kernel(xs[m][p.w.shape[0]], p.amx, p.w.shape[1]) for p in projs]

        same = all(torch.equal(a, b) for m in rows for a, b in zip(layers(old_gemm, m), layers(new_gemm, m)))
        t = alternate({m: (m,) for m in rows}, {"base": lambda m: layers(old_gemm, m),
                                                "this": lambda m: layers(new_gemm, m)}, args.repeats, 1)
        print(f"the target's {len(projs)} layer projections (same bits: {same}):")
        for m in rows:
            print(f"  {m:4} rows  base {t[('base', m)] * 1e3:7.2f}  this {t[('this', m)] * 1e3:7.2f}")

        s = target.spec
        cases = {}
        for q_rows, cached in ((1, 300), (8, 300), (16, 300), (16, 1000)):
            q = torch.randn(s.num_heads, q_rows, s.head_dim, generator=g).bfloat16()
            k, v = (torch.randn(s.num_kv_heads, cached, s.head_dim, generator=g).bfloat16() for _ in range(2))
            mask = None if q_rows == 1 else torch.cat([torch.ones(q_rows, cached - q_rows, dtype=torch.bool),
                                                       torch.ones(q_rows, q_rows, dtype=torch.bool).tril_()], 1)
            cases[(q_rows, cached)] = (q, k, v, mask)
        same = all(torch.equal(old_att(*c), new_att(*c)) for c in cases.values())
        t = alternate(cases, {"base": old_att, "this": new_att}, args.repeats, 50)
        print(f"one attention layer ({s.num_heads} q / {s.num_kv_heads} kv heads, d={s.head_dim}; same bits: {same}):")
        for key in cases:
            print(f"  {key[0]:3} rows, {key[1]:5} cached  base {t[('base', key)] * 1e3:7.4f}  "
                  f"this {t[('this', key)] * 1e3:7.4f}")


if __name__ == "__main__":
    sys.exit(main())
