"""Outputs written atomically next to where they go (a build's engine, a convert's checkpoint), hidden work dirs named
so that a later run can tell its own leftovers from live work, and SIGTERM turned into the same clean unwind as Ctrl-C.

    with staged_dir(out, "tmp") as tmp:   # <parent>/.<name>.tmp-<pid>-<random>, removed if the block raises
        ...write into tmp...
        swap_into_place(tmp, out)         # out is replaced whole; there is no moment without it
    sweep_stale(out, ("tmp", "old"))      # a later run: removes what processes killed outright left behind

A run killed outright (SIGKILL, power loss) cannot clean up after itself; the next run for the same output does, and
only dirs whose owning process no longer exists, so two runs side by side never touch each other's work.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import threading
from pathlib import Path

from eagle_trt.errors import InputError

_STOPS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, `docker stop`, CI cancellation), raised where the process is, like Ctrl-C's
    KeyboardInterrupt: every `finally` and cleanup handler on the way out runs."""

    exit_code = 128 + signal.SIGTERM


def _raise_terminated(signum, frame):
    raise Terminated()


def terminate_like_interrupt() -> None:
    """Make SIGTERM raise `Terminated` in the main thread (a no-op elsewhere: only it may set handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT and SIGTERM until the block ends (they are delivered then): for the few renames that must not be
    cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def check_apart(source: str | Path, out: Path, what: str) -> None:
    """Replacing OUT must not delete or write into an input: refuse an OUT that is the input, holds it, or lies
    inside it (whatever --force says). InputError naming both."""
    src, dst = Path(source).expanduser().resolve(), Path(out).expanduser().resolve()
    if src == dst or dst in src.parents or src in dst.parents:
        where = "is" if src == dst else "holds" if dst in src.parents else "lies inside"
        raise InputError(f"--output {out} {where} {what} ({src}); choose an output outside it")


def _hidden(out: Path, kind: str) -> Path:
    return out.parent / f".{out.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


@contextlib.contextmanager
def staged_dir(out: Path, kind: str):
    """An empty hidden dir beside `out` (same filesystem, so renaming it onto `out` is atomic), mode 0755 (what is
    built there is ordinary shared data), removed if the block raises, Ctrl-C and SIGTERM included. Its name is
    fixed before it exists, so no signal can land between its creation and the cleanup that covers it."""
    tmp = _hidden(out, kind)
    try:
        tmp.mkdir()
        os.chmod(tmp, 0o755)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished `tmp` onto `out`. An existing `out` is moved aside first and deleted after the swap, and
    put back if the swap fails; signals wait until both renames are done, so `out` is never missing."""
    with signals_deferred():
        if not out.exists():
            os.replace(tmp, out)
            return
        old = _hidden(out, "old")
        old.mkdir()
        os.replace(out, old / out.name)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old / out.name, out)
            old.rmdir()
            raise
    shutil.rmtree(old, ignore_errors=True)


def sweep_stale(out: Path, kinds: tuple[str, ...]) -> list[Path]:
    """Remove the hidden dirs `staged_dir(out, kind)` (and `swap_into_place`'s "old") made for any of `kinds` in
    processes that have exited; return what was removed. A previous `out` parked in an "old" dir while `out` is
    missing is put back, not deleted."""
    if not out.parent.is_dir():
        return []
    pattern = re.compile(rf"\.{re.escape(out.name)}\.({'|'.join(map(re.escape, kinds))})-(\d+)-[0-9a-f]+")
    removed = []
    for entry in sorted(out.parent.iterdir()):
        m = pattern.fullmatch(entry.name)
        if not m or not entry.is_dir() or entry.is_symlink() or _alive(int(m.group(2))):
            continue
        if m.group(1) == "old" and (entry / out.name).is_dir() and not out.exists():
            os.replace(entry / out.name, out)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OverflowError:
        return False
    return True
