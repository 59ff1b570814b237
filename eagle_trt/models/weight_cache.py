"""An engine's weights in this machine's runtime layout, made once and read back at every later start.

An engine holds portable weights (safetensors, HF names: what any CPU, transformers and TensorRT-LLM read). The
runtime wants them fused (q/k/v, gate/up), transposed to [in, out] and packed for the kernels this CPU runs, and that
packing depends on the CPU (the vector width, AMX tiles). So the first start on a machine (or `eagle-trt build`, on
the build machine) makes that layout and stores it here; later starts map the file (or, in long-running
commands, read it into huge pages: `huge_pages.py`) and rearrange nothing.

    model = load_or_make(source, "target", backend.cache_key, make, state_of, restore)

Where: `layouts/` in the private cache dir (`private_cache.py`: <cache>/eagle-trt-cache, 0700, refused when others
can write it; EAGLE_TRT_WEIGHT_CACHE=0 turns it off). What it trusts:

- A layout is named by the sha256 its engine's manifest gives each weight file (not by where the engine lies, so a
  copied or moved engine keeps it), the role, the backend (kernel build, dtype, AMX or vectors) and this format.
- It is stored only when the bytes it was made from were proven to be those (`WeightSource.proven`: hashed when the
  engine was opened and not written since): a start with --skip-verify, or on files that changed, makes its layout
  in memory and stores nothing, so no later start can be served a layout of unchecked bytes.
- Each file carries an xxh3-128 checksum of its data, checked whenever it is read, and an HMAC of its header under
  the cache's key. A layout that fails either (damaged, edited, cut short, written without the key) is a miss: it is
  made again, and the run says so once.

The cache keeps itself small: a write removes the layouts whose engine dir is gone and then the least recently used
ones until the rest fit $EAGLE_TRT_WEIGHT_CACHE_MAX (default 16GiB; a size such as 8GB or 500MiB, or bytes; 0 keeps
none), never the file just written. It only ever removes files it can prove it wrote: in `layouts/`, named
`<role>-<32 hex>.etw`, starting with its magic.

File format: magic (8 bytes), header length (u64 LE), HMAC-SHA256 of the header (64 hex characters), the JSON
header, then each tensor's bytes at a 64-byte aligned offset from a 64-byte aligned base (the alignment the kernels'
allocations have).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import re
import struct
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar

import torch
import xxhash

from eagle_trt import private_cache
from eagle_trt.models import huge_pages
from eagle_trt.private_cache import WeightSource

log = logging.getLogger(__name__)

FORMAT = "eagle-trt-runtime-weights/2"
ALIGN = 64
MAGIC = b"ETRTLAY2"
_MAC_LEN = 64
_PREFIX = len(MAGIC) + 8 + _MAC_LEN
MAX_HEADER = 64 << 20  # far above any model's header; a larger length field is damage
SUFFIX = ".etw"
_ROLE = re.compile(r"[a-z][a-z0-9-]{0,31}")
_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}-[0-9a-f]{32}\.etw")
_TEMP = re.compile(r"\.[a-z][a-z0-9-]{0,31}-[0-9a-f]{32}\.etw\.[A-Za-z0-9_]+\.tmp")
TEMP_MAX_AGE_S = 24 * 3600  # a temp file older than this belongs to a process that died while writing
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
           "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
           "bool": torch.bool}
_DIR = "layouts"

Model = TypeVar("Model")


def layouts_dir(create: bool = True) -> Path | None:
    """Where layouts live, or None when the cache is off or not safe to use."""
    return private_cache.subdir(_DIR, create=create)


def cache_path(source: WeightSource | None, role: str, backend_key: str) -> Path | None:
    """The layout file for these weights as `role` ("target", "draft", ...) on a backend, or None (off)."""
    if source is None or not source.hashes:
        return None
    if not _ROLE.fullmatch(role):
        raise ValueError(f"weight cache role {role!r}: lowercase letters, digits and '-'")
    root = layouts_dir()
    if root is None:
        return None
    blob = json.dumps([FORMAT, role, backend_key, source.identity()], sort_keys=True).encode()
    return root / f"{role}-{hashlib.sha256(blob).hexdigest()[:32]}{SUFFIX}"


def load_or_make(source: WeightSource | None, role: str, backend_key: str, make: Callable[[], Model],
                 state_of: Callable[[Model], tuple[dict, dict]],
                 restore: Callable[[dict, dict], Model]) -> Model:
    """The model from its stored layout when this machine made it before, else `make()`, stored when its bytes were
    proven (see the module doc). `restore` may raise KeyError/ValueError/TypeError on a layout it cannot use: that
    is a miss."""
    private_cache.check_settings()
    huge_pages.enabled()  # a bad EAGLE_TRT_HUGE_PAGES fails here, before anything is read
    path = cache_path(source, role, backend_key)
    stored = read(path)
    if stored is not None:
        try:
            return restore(*stored)
        except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as e:
            _bad(path, f"does not fit this model ({type(e).__name__})")
    model = make()
    if path is not None and source.proven():
        cap = private_cache.max_bytes()
        if cap > 0:
            write(path, *state_of(model), source=source)
        else:
            prune(path.parent, 0)
    return model


def write(path: Path, tensors: dict[str, torch.Tensor], meta: dict, source: WeightSource | None = None) -> None:
    """Store the tensors and meta atomically; a cache that cannot be written is skipped (it only saves time).
    `source`: layouts stored earlier for the same model dir and role, which a rebuilt engine has made stale, are
    removed, so rebuilding an engine does not pile up layouts."""
    model_dir = str(Path(source.model_dir).resolve()) if source is not None else None
    owner = str(Path(source.owner).resolve()) if source is not None and source.owner is not None else model_dir
    entries, offset, digest = {}, 0, xxhash.xxh3_128()
    for name, t in tensors.items():
        pad = -offset % ALIGN
        digest.update(bytes(pad))
        offset += pad
        nbytes = t.numel() * t.element_size()
        entries[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset,
                         "bytes": nbytes}
        if nbytes:
            digest.update(_raw(t))
        offset += nbytes
    header = json.dumps({"format": FORMAT, "meta": meta, "tensors": entries, "source": model_dir, "owner": owner,
                         "slot": path.name.rsplit("-", 1)[0], "data_bytes": offset,
                         "checksum": digest.hexdigest()}).encode()
    tag = private_cache.mac(header)
    if tag is None:
        return
    base = _base(len(header))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(header)) + tag.encode() + header)
            for name, t in tensors.items():
                if t.numel():
                    f.seek(base + entries[name]["offset"])
                    f.write(_raw(t))
            f.truncate(base + offset)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        return
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    if model_dir is not None:
        _drop_stale(path, model_dir)
    prune(path.parent, private_cache.max_bytes(), keep=path)


def read(path: Path | None) -> tuple[dict[str, torch.Tensor], dict] | None:
    """The stored tensors (views of a private mapping of the file, or of a huge-page arena holding its data: see
    `_load_data`) and meta, or None when there is no usable file. Its checksum is verified over every byte first; a
    damaged file is reported once and removed (the caller makes the layout again)."""
    if path is None:
        return None
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None
    except OSError as e:
        _bad(path, f"cannot be read ({e.strerror})", remove=False)
        return None
    with f:
        header, problem = _parse(f)
        if problem is None:
            size = os.fstat(f.fileno()).st_size
            base = _base(header["_length"])
            if base + header["data_bytes"] != size:
                problem = f"has {size} bytes, its header says {base + header['data_bytes']} (cut short or extended)"
        if problem is not None:
            _bad(path, problem)
            return None
        try:
            data = _load_data(f, base, header["data_bytes"])
        except OSError as e:
            _bad(path, f"cannot be read ({e})", remove=False)
            return None
    view = memoryview(data.numpy())
    ok = xxhash.xxh3_128_hexdigest(view) == header["checksum"]
    view.release()
    if not ok:
        _bad(path, "does not match its checksum (its bytes changed after it was written)")
        return None
    try:  # recently used: what `prune` removes last
        os.utime(path)
    except OSError:
        pass
    tensors = {}
    for name, e in header["tensors"].items():
        dtype = _DTYPES[e["dtype"]]
        flat = data[e["offset"]:e["offset"] + e["bytes"]].view(dtype) if e["bytes"] else torch.empty(0, dtype=dtype)
        tensors[name] = flat.view(e["shape"])
    return tensors, header["meta"]


def _load_data(f, base: int, nbytes: int) -> torch.Tensor:
    """The file's nbytes of tensor data from offset base, as uint8: a view of a private mapping of the file, or,
    where `huge_pages.enabled()`, read into a huge-page arena (the kernels stream it faster there)."""
    if not huge_pages.enabled():
        return torch.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), dtype=torch.uint8)[base:]
    data = huge_pages.arena(nbytes)
    f.seek(base)
    view, done = memoryview(data.numpy()), 0
    while done < nbytes:
        n = f.readinto(view[done:done + (64 << 20)])
        if not n:
            raise OSError(f"{f.name} ended {nbytes - done} bytes early")
        done += n
    view.release()
    return data


def prune(root: Path, cap: int, keep: Path | None = None) -> list[Path]:
    """Remove this cache's layouts under root whose engine dir no longer exists, then the least recently used
    (oldest modification time: `read` refreshes it) until the rest take at most `cap` bytes; never `keep`, and
    never a file that is not provably a layout of this cache. Temp files of writers that died long ago go too. A
    process holding a removed file's data keeps it (read into memory, or mapped until unmapped). Returns what was
    removed."""
    entries, removed = [], []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    for name in names:
        f = root / name
        if _TEMP.fullmatch(name) and _stale_temp(f) and _unlink(f):
            removed.append(f)
            continue
        if not _NAME.fullmatch(name) or f == keep:
            continue
        st = _own_file(f)
        if st is None:
            continue
        header, _ = _header(f)  # trusted only when signed; a damaged layout of ours is pruned like any other
        owner = header.get("owner") if header else None
        if isinstance(owner, str) and not Path(owner).is_dir():
            if _unlink(f):
                removed.append(f)
            continue
        entries.append((st.st_mtime_ns, st.st_size, f))
    keep_size = keep.stat().st_size if keep is not None and keep.is_file() else 0
    total = sum(size for _, size, _ in entries) + keep_size
    for _, size, f in sorted(entries, key=lambda e: e[0]):
        if total <= cap:
            break
        if _unlink(f):
            removed.append(f)
            total -= size
    return removed


# ---- helpers -----------------------------------------------------------------------------------------------------

def _raw(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()).cast("B")


def _base(header_len: int) -> int:
    return -(-(_PREFIX + header_len) // ALIGN) * ALIGN


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _parse(f) -> tuple[dict | None, str | None]:
    """(header, None) for a layout this cache wrote whose header is whole and consistent, else (header or None,
    what is wrong). The header gets `_length` (its size in bytes)."""
    prefix = f.read(_PREFIX)
    if len(prefix) < _PREFIX or not prefix.startswith(MAGIC):
        return None, "is not a layout file"
    (n,) = struct.unpack("<Q", prefix[len(MAGIC):len(MAGIC) + 8])
    if n > MAX_HEADER:
        return None, f"has a header length of {n} bytes (damaged)"
    raw = f.read(n)
    if len(raw) != n:
        return None, "is cut short inside its header"
    if not private_cache.mac_ok(raw, prefix[len(MAGIC) + 8:].decode("ascii", "replace")):
        return None, "has a header this cache did not sign"
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        return None, "has a header that is not JSON"
    problem = _check_header(header)
    if problem is not None:
        return None, problem
    # The alignment padding after the header is written as zeros: checked too, so that no byte of the file can change
    # unnoticed (the MAC covers the header, the checksum the data).
    if f.read(_base(n) - _PREFIX - n).strip(b"\0"):
        return None, "has a changed byte between its header and its data"
    header["_length"] = n
    return header, None


def _check_header(h) -> str | None:
    """What is inconsistent in a parsed header (types, dtypes, sizes, offsets), or None."""
    if not isinstance(h, dict) or h.get("format") != FORMAT:
        return "is of another format"
    data, tensors = h.get("data_bytes"), h.get("tensors")
    if not _nonneg(data) or not isinstance(tensors, dict) or not isinstance(h.get("meta"), dict) \
            or not isinstance(h.get("checksum"), str):
        return "has an incomplete header"
    for name, e in tensors.items():
        if not isinstance(e, dict) or e.get("dtype") not in _DTYPES:
            return f"has an unreadable entry for {name!r}"
        shape, offset, nbytes = e.get("shape"), e.get("offset"), e.get("bytes")
        if not isinstance(shape, list) or not all(_nonneg(d) for d in shape) or not _nonneg(offset) \
                or not _nonneg(nbytes) or offset % ALIGN:
            return f"has an unreadable entry for {name!r}"
        count = 1
        for d in shape:
            count *= d
        if count * _itemsize(_DTYPES[e["dtype"]]) != nbytes or offset + nbytes > data:
            return f"has an entry for {name!r} whose shape, size and offset disagree"
    return None


def _nonneg(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _header(path: Path) -> tuple[dict | None, str | None]:
    try:
        with open(path, "rb") as f:
            return _parse(f)
    except OSError:
        return None, "cannot be read"


def _own_file(f: Path) -> os.stat_result | None:
    """The file's stat when it is a regular file (not a link) that starts with this cache's magic."""
    try:
        st = os.lstat(f)
        if not (st.st_mode & 0o170000 == 0o100000):
            return None
        with open(f, "rb") as fh:
            return st if fh.read(len(MAGIC)) == MAGIC else None
    except OSError:
        return None


def _stale_temp(f: Path) -> bool:
    try:
        st = os.lstat(f)
    except OSError:
        return False
    return st.st_mode & 0o170000 == 0o100000 and time.time() - st.st_mtime > TEMP_MAX_AGE_S


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def _bad(path: Path, why: str, remove: bool = True) -> None:
    """A stored layout that cannot be used: said once, removed when it is provably this cache's (it is made again)."""
    private_cache.warn_once(f"layout:{path}", f"weight cache: layout '{path}' {why}; making it again")
    if remove and _NAME.fullmatch(path.name) and _own_file(path) is not None:
        _unlink(path)


def _drop_stale(kept: Path, model_dir: str) -> None:
    """Remove the other layouts made from `model_dir` for the same role (what the file name starts with)."""
    slot = kept.name.rsplit("-", 1)[0]
    for other in kept.parent.glob(f"{slot}-*{SUFFIX}"):
        if other == kept or not _NAME.fullmatch(other.name) or _own_file(other) is None:
            continue
        header, _ = _header(other)
        if header is not None and header.get("source") == model_dir and header.get("slot") == slot:
            _unlink(other)
