"""The per-user cache dir that runtime weight layouts and integrity records live in, and what it trusts.

    home = private_cache.home()             # <root>/eagle-trt-cache, made 0700; None: off or not safe to use
    tag = private_cache.mac(b"...")         # HMAC-SHA256 under this cache's own key
    private_cache.stamp(path)               # what any write to a file changes: inode, size, mtime, ctime

Where: the root is $EAGLE_TRT_WEIGHT_CACHE, else $EAGLE_TRT_CACHE/weights, else ~/.cache/eagle-trt/weights
(EAGLE_TRT_WEIGHT_CACHE=0: no cache). Everything this module hands out lies in one subdir of the root,
`eagle-trt-cache/`, which it creates with mode 0700; nothing outside that subdir is ever written or removed, so a
root that holds other files (a model dir, a home dir) keeps them.

What it trusts, and why: the subdir must be a real directory owned by this user and writable by nobody else (as ssh
treats ~/.ssh); otherwise a warning names it and the reason once, and the cache is not used (every start makes its
layout in memory and hashes in full). Inside it, a secret key (`key`, 32 random bytes, 0600, made with the dir)
signs every record and layout header, so a file that was copied in from elsewhere or written by anything that cannot
read the key is ignored. Someone who can read your files can also forge them: the cache is as trustworthy as your
account, not more.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from eagle_trt.errors import InputError

log = logging.getLogger(__name__)

SUBDIR = "eagle-trt-cache"
KEY_NAME = "key"
_KEY_BYTES = 32
_warned: set[str] = set()

MAX_ENV = "EAGLE_TRT_WEIGHT_CACHE_MAX"
DEFAULT_MAX = "16GiB"


def root() -> Path | None:
    """The dir the user chose for the cache (it may hold other files), or None when EAGLE_TRT_WEIGHT_CACHE=0."""
    chosen = os.environ.get("EAGLE_TRT_WEIGHT_CACHE")
    if chosen == "0":
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("EAGLE_TRT_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "eagle-trt") / "weights"


def home(create: bool = True) -> Path | None:
    """This cache's own dir (made 0700 when create), or None: off, not creatable, or not safe (warned once)."""
    base = root()
    if base is None:
        return None
    return _private(base / SUBDIR, create, parents=True, fix=" (0 turns the cache off)")


def subdir(name: str, create: bool = True) -> Path | None:
    """A dir inside home() (0700, checked like it), or None."""
    base = home(create)
    return None if base is None else _private(base / name, create)


def _private(path: Path, create: bool, parents: bool = False, fix: str = "") -> Path | None:
    """`path` as a dir of this account's alone (made 0700 when create), or None: absent, not creatable, or not safe
    (warned once, saying why and what to do)."""
    try:
        if create:
            if parents:
                path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
        elif not os.path.lexists(path):
            return None
        why = untrusted_dir(path)
    except OSError as e:
        why = f"cannot be created ({e.strerror})"
    if why is not None:
        hint = ", or set EAGLE_TRT_WEIGHT_CACHE to a dir of your own" + fix if parents else ""
        warn_once(str(path), f"weight cache '{path}' is not used: it {why}; run `chmod 700 '{path}'` if it is "
                             f"yours{hint}")
        return None
    return path


def untrusted_dir(path: Path) -> str | None:
    """Why `path` is not a dir only this user can change, or None when it is."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by {'others' if st.st_mode & 0o002 else 'its group'} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)


def _key() -> bytes | None:
    """The cache's secret (made on first use, 0600), or None when the cache is unusable."""
    base = home()
    if base is None:
        return None
    path = base / KEY_NAME
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            _make_key(path)
            continue
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(_KEY_BYTES + 1)
        if (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077
                and len(data) == _KEY_BYTES):
            return data
        warn_once(str(path), f"weight cache key '{path}' is not a 0600 file of yours of {_KEY_BYTES} bytes: the cache "
                             f"is not used; delete '{base}' to start a new one")
        return None
    return None


def _make_key(path: Path) -> None:
    """Create the key exclusively (two processes racing: one wins, both then read the same key)."""
    tmp = path.with_name(f".{KEY_NAME}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(_KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # fails if another process made it first: theirs is kept
    except FileExistsError:
        pass
    except OSError:
        return
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def mac(data: bytes) -> str | None:
    """HMAC-SHA256 of data under the cache's key (hex), or None when the cache is unusable."""
    key = _key()
    return None if key is None else hmac.new(key, data, hashlib.sha256).hexdigest()


def mac_ok(data: bytes, tag: object) -> bool:
    expected = mac(data)
    return (expected is not None and isinstance(tag, str) and tag.isascii()
            and hmac.compare_digest(expected, tag))


def stamp(path: Path) -> list[int]:
    """What any write to a file changes: inode, size, mtime and ctime (the kernel sets ctime on every write and
    metadata change; no tool can set it back)."""
    st = os.stat(path)
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def max_bytes() -> int:
    """The layouts' size cap from $EAGLE_TRT_WEIGHT_CACHE_MAX (default 16GiB); 0 keeps no layouts. Anything that is
    not a size is an InputError naming the variable."""
    # Imported here: safetensors_stream imports torch (over a second), and `inspect` loads this module without it.
    from eagle_trt.safetensors_stream import parse_size

    text = os.environ.get(MAX_ENV, "").strip() or DEFAULT_MAX
    if text == "0":
        return 0
    try:
        return parse_size(text)
    except ValueError:
        raise InputError(f"{MAX_ENV}={text!r} is not a size: give e.g. 16GiB, 500MB or a number of bytes "
                         "(0 keeps no layouts)") from None


def check_settings() -> None:
    """Fail early (before anything is loaded or built) on a cache setting that is not valid."""
    if root() is not None:
        max_bytes()


@dataclass(frozen=True)
class WeightSource:
    """The weights something cached is made from: a model dir of an engine, the sha256 its manifest gives each file
    there, and the stamps of the files this process proved to hold those bytes (empty: not proven, e.g. an engine
    opened with --skip-verify). Cached data is named by the hashes alone (an engine copied or moved keeps it) and
    stored only while every file still has the stamp it was proven with: then the bytes read were the proven ones."""

    model_dir: Path
    hashes: dict[str, str]
    checked: dict[str, list[int]] = field(default_factory=dict)
    owner: Path | None = None  # the engine dir: cached data whose owner is gone is pruned first

    def identity(self) -> list:
        return sorted(self.hashes.items())

    def proven(self) -> bool:
        """Every file still holds the bytes its manifest hash names (same stamp as when that was proven)."""
        if not self.hashes:
            return False
        for name in self.hashes:
            want = self.checked.get(name)
            try:
                if want is None or stamp(self.model_dir / name) != want:
                    return False
            except OSError:
                return False
        return True
