"""Does it matter which thread runs the model? `--mode ar` tokens/s with the engine opened in the main thread and
decoded there or in another thread, and opened and decoded in one other thread.

    python scripts/engine_thread_check.py --engine engines/smollm2-135m-eagle3 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import threading
import time

from eagle_trt.runtime.session import Session


def rate(session: Session, ids: list[int], n: int) -> float:
    cfg = session.decode_config(mode="ar", max_new_tokens=n)
    t = time.perf_counter()
    r = session.runner.generate(ids, cfg)
    return len(r.token_ids) / (time.perf_counter() - t)


def in_thread(fn):
    out = []
    th = threading.Thread(target=lambda: out.append(fn()))
    th.start()
    th.join()
    return out[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt", default="Write a haiku about the sea")
    args = ap.parse_args()

    def fresh_in_thread() -> float:
        s = Session.open(args.engine)
        ids = s.encode(args.prompt)
        rate(s, ids, 8)
        return rate(s, ids, args.max_new_tokens)

    print(f"opened and decoded in one other thread: {in_thread(fresh_in_thread):.1f} tok/s")
    s = Session.open(args.engine)
    ids = s.encode(args.prompt)
    rate(s, ids, 8)
    print(f"opened in main, decoded in main:        {rate(s, ids, args.max_new_tokens):.1f} tok/s")
    print(f"opened in main, decoded in another:     {in_thread(lambda: rate(s, ids, args.max_new_tokens)):.1f} tok/s")


if __name__ == "__main__":
    main()
