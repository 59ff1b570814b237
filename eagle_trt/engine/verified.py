"""Which engine files this machine has hashed and found intact, so opening an engine re-hashes only what changed.

A record holds, per file, its sha256 and its stamp (`private_cache.stamp`: inode, size, mtime and ctime; the kernel
sets ctime on every write and metadata change, and no tool can set it back). A file whose record still matches is
the file that was hashed. A file changed in the last seconds is not recorded: its timestamps could still hide a
change made within their granularity. Records live in the private cache dir (`private_cache.py`:
<cache>/eagle-trt-cache/records, one JSON per engine dir; EAGLE_TRT_WEIGHT_CACHE=0 keeps none) and carry an HMAC under
the cache's key: a record written by anything that cannot read the key (copied in, edited by hand) is ignored and the
files are hashed in full. `eagle-trt inspect` always hashes in full; a record that cannot be written only means the
next open hashes again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from eagle_trt import private_cache

RACY_S = 2.0  # a file changed this recently may change again within the timestamps' granularity: never recorded
_DIR = "records"


def _path(root: Path, create: bool) -> Path | None:
    base = private_cache.subdir(_DIR, create=create)
    if base is None:
        return None
    return base / (hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:24] + ".json")


def _signed(root: Path, files: dict) -> bytes:
    return json.dumps({"engine": str(root.resolve()), "files": files}, sort_keys=True).encode()


def load(root: Path) -> dict:
    """The files of `root` recorded as hashed ({} when none, or when the record is not one this cache signed)."""
    path = _path(root, create=False)
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = data["files"]
        if not isinstance(files, dict) or not private_cache.mac_ok(_signed(root, files), data.get("mac")):
            return {}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return {}
    return files


def unchanged(seen: dict, file: Path, sha256: str) -> list[int] | None:
    """The file's stamp when it is the one hashed to `sha256` before and not written since, else None."""
    rec = seen.get(str(file.resolve()))
    if not isinstance(rec, dict) or rec.get("sha256") != sha256:
        return None
    now = private_cache.stamp(file)
    return now if rec.get("stamp") == now else None


def settled(file_stamp: list[int]) -> bool:
    """Whether a stamp is old enough to prove the file unchanged while it stays the same (see RACY_S)."""
    return time.time_ns() - max(file_stamp[2], file_stamp[3]) > RACY_S * 1e9


def record(seen: dict, file: Path, sha256: str, file_stamp: list[int]) -> None:
    if settled(file_stamp):
        seen[str(file.resolve())] = {"sha256": sha256, "stamp": file_stamp}


def save(root: Path, seen: dict) -> None:
    path = _path(root, create=True)
    tag = private_cache.mac(_signed(root, seen)) if path is not None else None
    if tag is None:
        return
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"engine": str(root.resolve()), "files": seen, "mac": tag}, f)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
