"""Two builds of the compiled kernels side by side: this checkout's and another git revision's.

    python scripts/kernel_ab.py --engine engines/smollm2-135m-eagle3-bf16 --base HEAD~1 --threads 2
    EAGLE_TRT_ISA=avx2 python scripts/kernel_ab.py --engine E --base HEAD~1     # both built for AVX2

The base revision's `eagle_trt/models/csrc` is compiled with the same compiler and flags into a temporary directory;
both libraries are loaded into this process and timed alternately, repeat by repeat, on the same inputs:

- every layer projection of the engine's target at several row counts, on each projection kernel both builds have
  (AMX tiles for a bf16 engine where the CPU has them; the vector kernel), each build packing its own weights;
- one attention layer (the target's head shape, the engine's dtype) at several query rows and cached tokens.

It prints the medians in ms and checks that both builds give the same bits (a kernel change that is meant to keep
them must). Machines here drift within minutes, so only the side-by-side ratio means much.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from eagle_trt.models import native
from eagle_trt.models.native import bindings, build


def build_revision(rev: str, out_dir: Path) -> Path:
    """Compile revision `rev`'s kernels (the files in its csrc/) into out_dir; returns the library path."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    rel = build.CSRC.relative_to(root)
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
    cmd = [build.compiler() or "g++", *build.flags(), *map(str, sorted(src.glob("*.cpp"))), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"kernel_ab: building {rev} failed: {proc.stderr.strip()[-2000:]}")
    return lib


class Kernels:
    """The projections and attention of one build, bound from this checkout's kernels.h where the build has the
    symbol (the entry points compared here keep their signatures across revisions)."""

    def __init__(self, path: Path):
        self.cdll = ctypes.CDLL(str(path))
        table = bindings.signatures()
        for name in ("eagle_trt_gemm", "eagle_trt_gemm_pack", "eagle_trt_gemm_packed_size", "eagle_trt_amx_gemm",
                     "eagle_trt_amx_pack", "eagle_trt_amx_available", "eagle_trt_tree_attention"):
            fn = getattr(self.cdll, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = table[name]
            setattr(self, name[len(bindings.PREFIX):], fn)
        self.has_amx = self.amx_available is not None and self.amx_available() == 1

    def packer(self, amx: bool):
        """w [K, N] -> (packed weight, call(x) -> y), or None where this build lacks that kernel."""
        if amx and not self.has_amx or not amx and self.gemm is None:
            return None

        def pack(w: torch.Tensor):
            k, n = w.shape
            bf = int(w.dtype == torch.bfloat16)
            if amx:
                packed = torch.empty((n + 31) // 32 * 32 * k, dtype=w.dtype)
                self.amx_pack(w.data_ptr(), packed.data_ptr(), k, n)
            else:
                packed = torch.empty(self.gemm_packed_size(k, n, bf), dtype=w.dtype)
                self.gemm_pack(w.data_ptr(), packed.data_ptr(), k, n, bf)

            def call(x: torch.Tensor) -> torch.Tensor:
                out = torch.empty(x.shape[0], n, dtype=w.dtype)
                threads = torch.get_num_threads()
                rc = (self.amx_gemm(x.data_ptr(), packed.data_ptr(), out.data_ptr(), x.shape[0], k, n, threads) if amx
                      else self.gemm(x.data_ptr(), packed.data_ptr(), out.data_ptr(), x.shape[0], k, n, bf, threads))
                if rc:
                    raise RuntimeError(f"projection failed (code {rc})")
                return out
            return call
        return pack

    def attention(self, q, k, v, mask):
        h, t, d = q.shape
        out = torch.empty(t, h * d, dtype=q.dtype)
        m = mask.view(torch.uint8) if mask is not None else None
        rc = self.tree_attention(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
                                 v.data_ptr(), v.stride(0), v.stride(1), m.data_ptr() if m is not None else None,
                                 out.data_ptr(), h, k.shape[0], t, k.shape[1], d, 1 / math.sqrt(d),
                                 int(q.dtype == torch.bfloat16), torch.get_num_threads())
        if rc:
            raise RuntimeError(f"attention failed (code {rc})")
        return out


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


def compare_projections(builds: dict, weights: list, rows: list[int], reps: int, g) -> None:
    dtype = weights[0].dtype
    for amx in (True, False):
        packers = {name: b.packer(amx) for name, b in builds.items()}
        if any(p is None for p in packers.values()) or (amx and dtype != torch.bfloat16):
            continue
        calls = {name: [pack(w) for w in weights] for name, pack in packers.items()}
        xs = {m: {n: torch.randn(m, n, generator=g).to(dtype) for n in {w.shape[0] for w in weights}} for m in rows}

        def layer(fns, m):
            return [fn(xs[m][w.shape[0]]) for fn, w in zip(fns, weights)]

        same = all(torch.equal(a, b) for m in rows for a, b in zip(*(layer(c, m) for c in calls.values())))
        t = alternate({m: (m,) for m in rows}, {n: (lambda m, c=c: layer(c, m)) for n, c in calls.items()}, reps, 1)
        print(f"the target's {len(weights)} layer projections, {'AMX tiles' if amx else 'vector kernel'} "
              f"(same bits: {same}):")
        for m in rows:
            print(f"  {m:4} rows  " + "  ".join(f"{n} {t[(n, m)] * 1e3:7.2f}" for n in calls))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, help="an engine (its target's weights, dtype and head shape)")
    ap.add_argument("--base", required=True, help="git revision to compare this checkout with")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rows", default="1,8,12,16,17,120", help="projection row counts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from eagle_trt.engine.engine_dir import open_engine
    from eagle_trt.models.spec import TargetSpec
    from eagle_trt.models.weights import load_safetensors, read_json
    from eagle_trt.runtime.session import DTYPES

    if native.library() is None:
        raise SystemExit(f"kernel_ab: no kernels here: {native.unavailable()}")
    e = open_engine(args.engine, verify=False)
    dtype = DTYPES[e.config.dtype]
    spec = TargetSpec.from_hf_config(read_json(Path(e.target_dir) / "config.json"))
    w = load_safetensors(Path(e.target_dir) / "model.safetensors", dtype)
    weights = []
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        weights += [torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]).t().contiguous(),
                    w[p + "self_attn.o_proj.weight"].t().contiguous(),
                    torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]).t().contiguous(),
                    w[p + "mlp.down_proj.weight"].t().contiguous()]
    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"base": Kernels(build_revision(args.base, Path(tmp))), "this": Kernels(native.library().path)}
        print(f"threads {args.threads}, base {args.base}, {e.config.dtype}, flags {' '.join(build.flags())}; "
              f"medians of {args.repeats}, ms")
        compare_projections(builds, weights, [int(r) for r in args.rows.split(",")], args.repeats, g)
        cases = {}
        for q_rows, cached in ((1, 300), (8, 300), (16, 300), (16, 1000), (16, 1024)):
            q = torch.randn(spec.num_heads, q_rows, spec.head_dim, generator=g).to(dtype)
            k, v = (torch.randn(spec.num_kv_heads, cached, spec.head_dim, generator=g).to(dtype) for _ in range(2))
            mask = None if q_rows == 1 else torch.cat([torch.ones(q_rows, cached - q_rows, dtype=torch.bool),
                                                       torch.ones(q_rows, q_rows, dtype=torch.bool).tril_()], 1)
            cases[(q_rows, cached)] = (q, k, v, mask)
        same = all(torch.equal(builds["base"].attention(*c), builds["this"].attention(*c)) for c in cases.values())
        t = alternate(cases, {n: b.attention for n, b in builds.items()}, args.repeats, 50)
        print(f"one attention layer ({spec.num_heads} q / {spec.num_kv_heads} kv heads, d={spec.head_dim}; "
              f"same bits: {same}):")
        for key in cases:
            print(f"  {key[0]:3} rows, {key[1]:5} cached  " + "  ".join(f"{n} {t[(n, key)] * 1e3:7.4f}"
                                                                      for n in builds))


if __name__ == "__main__":
    sys.exit(main())
