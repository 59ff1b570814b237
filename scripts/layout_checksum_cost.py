"""What checking a weight-cache layout costs when it is mapped (models/weight_cache.py), beside a cryptographic hash.

    python scripts/layout_checksum_cost.py --engine engines/smollm2-135m-eagle3 --gib 3 --repeats 5

Prints min / median seconds over the repeats for: xxh3-128 (the layout's checksum) and sha256 over an in-memory
buffer of --gib GiB, and `weight_cache.read` (header, MAC, checksum, mapping) of each layout the engine has in the
weight cache (open the engine once first so there is one).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import xxhash

from eagle_trt import private_cache
from eagle_trt.models import weight_cache


def timed(fn, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    buf = memoryview(bytearray(int(args.gib * 2**30)))
    for name, fn in (("xxh3_128", lambda: xxhash.xxh3_128(buf).digest()),
                     ("sha256", lambda: hashlib.sha256(buf).digest())):
        lo, med = timed(fn, args.repeats)
        print(f"{name:9s} {args.gib:g} GiB: min {lo:.3f} s, median {med:.3f} s ({args.gib / lo:.1f} GiB/s at best)")
    home = private_cache.home(create=False)
    layouts = sorted((home / "layouts").glob("*.etw")) if home is not None else []
    for path in layouts:
        size = path.stat().st_size
        lo, med = timed(lambda: weight_cache.read(path), args.repeats)
        print(f"read {path.name} ({size / 2**20:.0f} MiB): min {lo * 1e3:.1f} ms, median {med * 1e3:.1f} ms")
    if not layouts:
        print("no layout in the weight cache: open an engine once (eagle-trt run) and rerun")


if __name__ == "__main__":
    main()
