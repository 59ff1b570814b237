"""Copy a trained draft head out of a checkpoint as a small fp16 head dir (what heads/ ships).

    python scripts/export_head.py /tmp/smol-trained heads/smollm2-135m-instruct

Writes config.json, model.safetensors (floating tensors in fp16, d2t kept int64), report.json, and the
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
    args = ap.parse_args()

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(args.checkpoint / "draft" / "model.safetensors"))
    half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in sorted(tensors.items())}
    args.output.mkdir(parents=True, exist_ok=True)
    save_file(half, str(args.output / "model.safetensors"), metadata={"format": "pt"})
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
