"""Compile the kernels (`models/csrc/*.cpp`) into one shared library, once per source, flags and CPU.

The library goes to `$EAGLE_TRT_CACHE/kernels` (default `~/.cache/eagle-trt/kernels`), named by a hash of what it
depends on. A file lock makes two processes that need the same build wait for one compile instead of running two;
the result is written atomically and made readable by every user of a shared cache. `$CXX` (else g++, else c++)
compiles it, within `EAGLE_TRT_BUILD_TIMEOUT` seconds (default 300). `EAGLE_TRT_CXXFLAGS` adds flags (the mutation
tests build with a perturbing define this way).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from eagle_trt.models import isa

CSRC = Path(__file__).resolve().parents[1] / "csrc"


def sources() -> list[Path]:
    """The library's .cpp files, listed when asked: a build compiles exactly the files its key was taken over."""
    return sorted(CSRC.glob("*.cpp"))


def headers() -> list[Path]:
    return sorted(CSRC.glob("*.h"))
# -ffp-contract=off: no multiply-add is fused behind the kernels' back (they fuse explicitly where they mean to).
# -Bsymbolic: the library's kernels call each other, never a same-named function of another build loaded beside it.
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared", "-std=c++17", "-Wl,-Bsymbolic"]
LIBRARY_MODE = 0o755  # read (and map) by every user of a shared cache


def cache_dir() -> Path:
    root = os.environ.get("EAGLE_TRT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "eagle-trt") / "kernels"


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return name
    return None


def timeout_s() -> float:
    return float(os.environ.get("EAGLE_TRT_BUILD_TIMEOUT", "300"))


def flags(target_isa: str | None = None) -> list[str]:
    """Every compiler flag of a build: optimisation and ABI, the ISA's -march, then EAGLE_TRT_CXXFLAGS."""
    return [*FLAGS, *isa.march_flags(target_isa), *shlex.split(os.environ.get("EAGLE_TRT_CXXFLAGS", ""))]


def library_path(cxx: str, build_flags: list[str], out_dir: Path, srcs: list[Path] | None = None) -> Path:
    """Where the build of these sources (default: the files there now), compiler, flags and CPU lives."""
    srcs = sources() if srcs is None else srcs
    src = b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in (*srcs, *headers()))
    key = hashlib.sha256(b"\0".join([src, cxx.encode(), " ".join(build_flags).encode(), isa.cpu_key().encode()]))
    return out_dir / f"eagle_trt_kernels-{key.hexdigest()[:16]}.so"


def build(cxx: str | None = None, out_dir: Path | None = None, target_isa: str | None = None) -> Path:
    """The library's path, compiling it first if this source, compiler, flags and CPU have no build yet.

    Raises RuntimeError with the compiler's message when it fails or runs past the timeout."""
    cxx = cxx or compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    build_flags = flags(target_isa)
    out_dir = out_dir or cache_dir()
    srcs = sources()  # one listing for the key and the compile, so both name the same files
    target = library_path(cxx, build_flags, out_dir, srcs)
    if target.exists():
        _check_trusted(target)
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_trusted(out_dir)
    with _locked(target.with_suffix(".lock")):
        if not target.exists():  # another process may have built it while this one waited
            _compile(cxx, build_flags, target, srcs)
    _check_trusted(target)
    return target


def _check_trusted(path: Path) -> None:
    """A library is code this process will run: it and its dir must be owned by this user or root and writable by
    no one else (a shared cache made by root serves every user). RuntimeError otherwise (the kernels are then
    unavailable, and the reason says where and why)."""
    for p in (path.parent, path) if path.is_file() else (path,):
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode) and p == path:
            raise RuntimeError(f"kernel library '{p}' is a symbolic link: not loaded")
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
            raise RuntimeError(f"kernel cache '{p}' is writable by another user (owner uid {st.st_uid}, mode "
                               f"{stat.S_IMODE(st.st_mode):04o}): not loaded; fix it with `chmod go-w '{p}'` or set "
                               "EAGLE_TRT_CACHE to a dir of your own")


class _locked:
    """An exclusive flock on `path` for the duration of a `with` block."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _compile(cxx: str, build_flags: list[str], target: Path, srcs: list[Path]) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    names = ", ".join(p.name for p in srcs)
    try:
        try:
            proc = subprocess.run([cxx, *build_flags, *map(str, srcs), "-o", tmp], capture_output=True, text=True,
                                  timeout=timeout_s())
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{cxx} did not finish {names} within {timeout_s():.0f} s "
                               "(EAGLE_TRT_BUILD_TIMEOUT)") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{cxx} failed on {names}: {proc.stderr.strip()[-2000:]}")
        os.chmod(tmp, LIBRARY_MODE)
        os.replace(tmp, target)  # atomic: a reader sees no library or the whole one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
