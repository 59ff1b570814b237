"""Write the prompt-lookup datastore of a trained head: the same token sequences `eagle-trt convert` trains on.

`eagle-trt convert --epochs N --data ...` writes OUT/draft/datastore.safetensors itself. This script makes one
for a head trained earlier (or shipped without it) from the same --data files:

    python scripts/make_datastore.py checkpoints/smollm2-135m-instruct/target heads/smollm2-135m-instruct \
        --data data/code_answers.jsonl --data data/chat_train_answers.jsonl --data data/chat_followup_answers.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle_trt.convert.data import build_dataset
from eagle_trt.engine.datastore_file import DATASTORE_NAME, write_datastore
from eagle_trt.tokenizer import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokenizer", help="dir with the target's tokenizer files (e.g. CKPT/target)")
    ap.add_argument("head", help="head dir to write datastore.safetensors into")
    ap.add_argument("--data", action="append", required=True, help="training data, as for eagle-trt convert")
    ap.add_argument("--seq-len", type=int, default=512, help="the --seq-len the head was trained with")
    args = ap.parse_args()
    tokenizer = load_tokenizer(Path(args.tokenizer))
    dataset = build_dataset(args.data, tokenizer, seq_len=args.seq_len, progress=False)
    out = Path(args.head) / DATASTORE_NAME
    n = write_datastore(out, dataset.sequences)
    print(f"wrote {out}: {n} tokens in {len(dataset.sequences)} sequences")


if __name__ == "__main__":
    main()
