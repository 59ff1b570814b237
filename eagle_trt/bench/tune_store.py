"""`eagle-trt tune`, storing the choice: tuned.json in the engine, listed in manifest.json with its hash."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path

from eagle_trt.engine.manifest import MANIFEST_NAME, FileEntry, read_manifest, sha256_file, write_manifest
from eagle_trt.errors import InputError
from eagle_trt.runtime.session import TUNED_NAME


def check_writable(engine_root: str | Path) -> None:
    """Fail before anything is measured when tuned.json could not be stored in the engine dir (read-only, not
    ours): a probe file is made and removed, which is what the store will do."""
    root = Path(engine_root)
    try:
        fd, probe = tempfile.mkstemp(dir=root, prefix=".tune-probe-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InputError(f"engine dir '{root}' is not writable ({e.strerror}): tune stores tuned.json there",
                         hint="fix its permissions, tune a copy of the engine, or pass --dry-run") from None


def _atomic_write(path: Path, text: str) -> None:
    """Write, fsync and rename into place. The temporary file is created with mode 0666 less the umask, as every
    other engine file is (mkstemp's 0600 would leave a deployed engine's tuned.json, which the manifest lists,
    unreadable to the user serving it)."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def store_tuned(engine_root: str | Path, best: dict, info: dict | None = None) -> Path:
    """Write engine_root/tuned.json and list it (sha256 + size) in manifest.json, both atomically.

    Session.decode_config then prefers these settings over the build config's."""
    root = Path(engine_root)
    manifest = read_manifest(root)
    data = {"tree": "dynamic", "beam_width": int(best["beam_width"]), "draft_length": int(best["draft_length"]),
            "total_tokens": int(best["total_tokens"]),
            "predicted_tokens_per_second": round(best["predicted_tokens_per_second"], 3),
            "tau": round(best["tau"], 4), **(info or {})}
    data["lookup_tokens"] = int(best.get("lookup_tokens", 0))
    data["lookup_branches"] = int(best.get("lookup_branches", 1))
    data["datastore_branches"] = int(best.get("datastore_branches", 0))
    data["max_verify_rows"] = int(best.get("max_verify_rows", 0))
    data["confidence_threshold"] = float(best.get("confidence_threshold", 0.0))
    if "fallback_after" in best:
        data["fallback_after"] = int(best["fallback_after"])
        data["measured_by_variant"] = best["measured_by_variant"]
    if "measured_tokens_per_second" in best:
        data["measured_tokens_per_second"] = round(best["measured_tokens_per_second"], 3)
        data["measured_tau"] = round(best["measured_tau"], 4)
    path = root / TUNED_NAME
    _atomic_write(path, json.dumps(data, indent=2, default=str) + "\n")
    files = dict(manifest.files)
    files[TUNED_NAME] = FileEntry(sha256=sha256_file(path), bytes=path.stat().st_size)
    updated = manifest.model_copy(update={"files": files})
    # write_manifest's own format, written beside the engine and moved into place in one rename.
    tmpdir = Path(tempfile.mkdtemp(dir=root, prefix=".manifest-"))
    try:
        os.replace(write_manifest(updated, tmpdir), root / MANIFEST_NAME)
    finally:
        for p in tmpdir.iterdir():
            p.unlink()
        tmpdir.rmdir()
    return path
