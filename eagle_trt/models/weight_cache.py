"""An engine's weights in this machine's runtime layout, made once and memory-mapped at every later start.

An engine holds portable weights (safetensors, HF names: what any CPU, transformers and TensorRT-LLM read). The
runtime wants them fused (q/k/v, gate/up), transposed to [in, out] and packed for the kernels this CPU runs, and that
packing depends on the CPU (the vector width, AMX tiles). So the first start on a machine (or `eagle-trt build`, on
the build machine) makes that layout and stores it here; later starts map the file and rearrange nothing.

    path = cache_path(model_dir, "target", backend)      # None: the cache is off
    state = read(path)                                   # (tensors, meta) mapped from disk, or None on a miss
    write(path, tensors, meta)                           # atomic (temp file, then rename)

Where: $EAGLE_TRT_WEIGHT_CACHE, else $EAGLE_TRT_CACHE/weights, else ~/.cache/eagle-trt/weights;
EAGLE_TRT_WEIGHT_CACHE=0 turns it off. The cache keeps itself small: each write removes the layouts whose engine dir
is gone (an engine moved elsewhere makes its layout again at its next start) and then the least recently used ones
until the rest fit $EAGLE_TRT_WEIGHT_CACHE_MAX (default 16GiB; a size such as 8GB or 500MiB, or bytes), never the
file just written. A file is keyed by the engine's weight files (their sha256 in the engine's
manifest, sizes and modification times; not where the engine lies, so a moved engine keeps its layout), the backend
(kernel build, dtype, AMX or vectors) and this format, so a rebuilt engine, another CPU or another kernel build never
reads a stale layout. The file is a JSON header followed by
each tensor's bytes at a 64-byte aligned offset (the alignment the kernels' allocations have).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
from pathlib import Path

import torch

FORMAT = "eagle-trt-runtime-weights/1"
ALIGN = 64
_MAGIC = b"EAGLETRT"
DEFAULT_MAX = "16GiB"


def cache_dir() -> Path | None:
    """Where runtime layouts live, or None when EAGLE_TRT_WEIGHT_CACHE=0."""
    chosen = os.environ.get("EAGLE_TRT_WEIGHT_CACHE")
    if chosen == "0":
        return None
    if chosen:
        return Path(chosen)
    root = os.environ.get("EAGLE_TRT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "eagle-trt") / "weights"


def _identity(model_dir: Path) -> list:
    """What names a model dir's weights: each weight file's size and modification time, and its sha256 from the
    engine's manifest.json (the parent dir's) where there is one."""
    hashes: dict = {}
    manifest = model_dir.parent / "manifest.json"
    try:
        files = json.loads(manifest.read_text(encoding="utf-8")).get("files", {})
        hashes = {rel: v.get("sha256") for rel, v in files.items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError):
        pass
    out = []
    for f in sorted(model_dir.iterdir()):
        if f.suffix in (".safetensors", ".json"):
            st = f.stat()
            out.append([f.name, st.st_size, st.st_mtime_ns, hashes.get(f"{model_dir.name}/{f.name}")])
    return out


def cache_path(model_dir: str | Path, role: str, backend_key: str) -> Path | None:
    """The cache file for this model dir's weights as `role` ("target", "draft", ...) on a backend, or None (off)."""
    root = cache_dir()
    if root is None:
        return None
    blob = json.dumps([FORMAT, role, backend_key, _identity(Path(model_dir))], sort_keys=True).encode()
    return root / f"{role}-{hashlib.sha256(blob).hexdigest()[:24]}.bin"


def write(path: Path, tensors: dict[str, torch.Tensor], meta: dict, source: str | Path | None = None) -> None:
    """Store the tensors and meta atomically; a cache that cannot be written is skipped (it only saves time).
    `source` (the model dir the layout was made from): layouts stored earlier for the same dir and backend, which a
    rebuilt engine has made stale, are removed, so rebuilding an engine does not pile up layouts."""
    source = str(Path(source).resolve()) if source is not None else None
    entries, offset = {}, 0
    for name, t in tensors.items():
        offset = -(-offset // ALIGN) * ALIGN
        nbytes = t.numel() * t.element_size()
        entries[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset,
                         "bytes": nbytes}
        offset += nbytes
    header = json.dumps({"format": FORMAT, "meta": meta, "tensors": entries, "source": source,
                         "slot": path.name.rsplit("-", 1)[0]}).encode()
    base = -(-(len(_MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + struct.pack("<Q", len(header)) + header)
            for name, t in tensors.items():
                f.seek(base + entries[name]["offset"])
                if t.numel():
                    f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            f.truncate(base + offset)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if source is not None:
        _drop_stale(path, source)
    if path.is_file():
        prune(path.parent, max_bytes(), keep=path)


def max_bytes() -> int:
    """The cache's size cap: $EAGLE_TRT_WEIGHT_CACHE_MAX, else DEFAULT_MAX (a value that is not a size: the default)."""
    from eagle_trt.safetensors_stream import parse_size

    try:
        return parse_size(os.environ.get("EAGLE_TRT_WEIGHT_CACHE_MAX") or DEFAULT_MAX)
    except ValueError:
        return parse_size(DEFAULT_MAX)


def prune(root: Path, cap: int, keep: Path | None = None) -> list[Path]:
    """Remove the layouts under root whose source dir no longer exists, then the least recently used (oldest
    modification time: `read` refreshes it) until the rest take at most `cap` bytes; never `keep`. A process that
    has a removed file mapped keeps reading it (the data stays until it is unmapped). Returns what was removed."""
    entries = []
    for f in root.glob("*.bin"):
        try:
            st = f.stat()
        except OSError:
            continue
        entries.append((st.st_mtime_ns, st.st_size, f))
    removed = []
    for _, _, f in entries:
        header = _header(f) if f != keep else None
        source = header.get("source") if header else None
        if source and not Path(source).is_dir() and _unlink(f):
            removed.append(f)
    live = sorted((e for e in entries if e[2] not in removed), key=lambda e: e[0])
    total = sum(size for _, size, _ in live)
    for _, size, f in live:
        if total <= cap:
            break
        if f != keep and _unlink(f):
            removed.append(f)
            total -= size
    return removed


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def _drop_stale(kept: Path, source: str) -> None:
    """Remove the other layouts made from `source` for the same role (what the file name starts with)."""
    slot = kept.name.rsplit("-", 1)[0]
    for other in kept.parent.glob(f"{slot}-*.bin"):
        if other == kept:
            continue
        header = _header(other)
        if header is not None and header.get("source") == source and header.get("slot") == slot:
            try:
                other.unlink()
            except OSError:
                pass


def _header(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                return None
            (n,) = struct.unpack("<Q", f.read(8))
            return json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return None


def read(path: Path | None) -> tuple[dict[str, torch.Tensor], dict] | None:
    """The stored tensors (views of a private read-only-in-practice mapping of the file: nothing is copied, pages
    load as the kernels touch them) and meta, or None when there is no usable file."""
    if path is None or not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                return None
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            if header.get("format") != FORMAT:
                return None
            base = -(-(len(_MAGIC) + 8 + n) // ALIGN) * ALIGN
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError, struct.error):
        return None
    try:  # recently used: what `prune` removes last
        os.utime(path)
    except OSError:
        pass
    tensors = {}
    for name, e in header["tensors"].items():
        dtype = getattr(torch, e["dtype"])
        count = e["bytes"] // torch.empty(0, dtype=dtype).element_size()
        if base + e["offset"] + e["bytes"] > len(mapped):
            return None
        flat = (torch.frombuffer(mapped, dtype=dtype, count=count, offset=base + e["offset"]) if count
                else torch.empty(0, dtype=dtype))
        tensors[name] = flat.view(e["shape"])
    return tensors, header["meta"]
