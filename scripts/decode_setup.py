"""What the decode-timing scripts (`native_ab.py`, `profile_decode.py`) share: their common options, and the engine
opened with its prompts encoded. Imported by path: the scripts run as `python scripts/NAME.py`."""

from __future__ import annotations

import argparse


def decode_parser(doc: str) -> argparse.ArgumentParser:
    """A parser with --engine, --prompts, --limit, --max-new-tokens and --threads."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    return ap


def open_session(args: argparse.Namespace):
    """(session, encoded prompts) with torch's threads set first."""
    import torch

    from eagle_trt.bench.prompts import load_prompts
    from eagle_trt.runtime.session import Session

    torch.set_num_threads(args.threads)
    session = Session.open(args.engine)
    return session, [p.encode(session.tokenizer) for p in load_prompts(args.prompts, args.limit)]
