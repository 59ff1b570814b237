"""Copy a trained draft head out of a checkpoint as a small fp16 head dir (what heads/ ships).

    python scripts/export_head.py /tmp/smol-trained heads/smollm2-135m-instruct
    python scripts/export_head.py /tmp/qwen15-trained heads/qwen2.5-coder-1.5b --q8-0   # half fp16's bytes

Writes config.json, model.safetensors (floating tensors in fp16, d2t kept int64; with --q8-0 every 2-D weight of
whole 32-blocks as GGUF q8_0 rows, eagle_trt/interop/head_blocks.py), report.json, and the
checkpoint's datastore.safetensors where it has one (the training text `convert --epochs N` writes beside a head
it trains; the prompt-lookup datastore, docs/bench.md).
`eagle-trt convert MODEL --output CKPT --head heads/NAME` then ships it with any copy of the target.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path, help="checkpoint dir written by `eagle-trt convert` (with draft/)")
    ap.add_argument("output", type=Path, help="head dir to write")
    ap.add_argument("--q8-0", action="store_true", help="store the projections as q8_0 rows (1.06 bytes a weight)")
    args = ap.parse_args()

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(args.checkpoint / "draft" / "model.safetensors"))
    meta = {"format": "pt"}
    if args.q8_0:
        from eagle_trt.interop.head_blocks import pack_q8_0

        tensors, meta = pack_q8_0(tensors)
    half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in sorted(tensors.items())}
    args.output.mkdir(parents=True, exist_ok=True)
    save_file(half, str(args.output / "model.safetensors"), metadata=meta)
    cfg = json.loads((args.checkpoint / "draft" / "config.json").read_text())
    cfg["torch_dtype"] = "float16"
    (args.output / "config.json").write_text(json.dumps(cfg, indent=2))
    if (args.checkpoint / "report.json").is_file():
        shutil.copyfile(args.checkpoint / "report.json", args.output / "report.json")
    if (args.checkpoint / "draft" / "datastore.safetensors").is_file():
        shutil.copyfile(args.checkpoint / "draft" / "datastore.safetensors", args.output / "datastore.safetensors")
    for p in args.output.iterdir():
        p.chmod(0o644)
    print(f"{args.output}: {sum(p.stat().st_size for p in args.output.iterdir()) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
