"""Which engine files this machine has hashed and found intact, so opening an engine re-hashes only what changed.

A record holds, per file, its sha256 and what any write to it would change: inode, size, mtime and ctime (the
kernel sets ctime on every write and metadata change; no tool can set it back). A file whose record still matches
is the file that was hashed; a file changed in the last seconds is not recorded (its timestamps could still hide a
change made within their granularity). `eagle-trt inspect` and `open_engine(verify=True)` on a file without a record hash in
full; records live beside the runtime weight layouts (`models/weight_cache.py`: <cache>/verified, one JSON per engine
dir; EAGLE_TRT_WEIGHT_CACHE=0 keeps none), and a record that cannot be written only means the next open hashes again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path


def _path(root: Path) -> Path | None:
    from eagle_trt.models.weight_cache import cache_dir

    base = cache_dir()
    if base is None:
        return None
    return base / "verified" / (hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:24] + ".json")


def _stamp(file: Path) -> list[int]:
    st = file.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def load(root: Path) -> dict:
    path = _path(root)
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def unchanged(seen: dict, file: Path, sha256: str) -> bool:
    """Whether `file` is the one hashed to `sha256` before and not written since."""
    rec = seen.get(str(file.resolve()))
    return isinstance(rec, dict) and rec.get("sha256") == sha256 and rec.get("stamp") == _stamp(file)


RACY_S = 2.0  # a file changed this recently may change again within the timestamps' granularity: never recorded


def record(seen: dict, file: Path, sha256: str) -> None:
    stamp = _stamp(file)
    if time.time_ns() - max(stamp[2], stamp[3]) > RACY_S * 1e9:
        seen[str(file.resolve())] = {"sha256": sha256, "stamp": stamp}


def save(root: Path, seen: dict) -> None:
    path = _path(root)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(seen, f)
        os.replace(tmp, path)
    except OSError:
        pass
