"""The answers a serving endpoint gave so far, one JSON line each in the work dir: a killed run continues from them
and never asks again for a prompt that was answered.

    with Progress(work / "regenerated.jsonl", identity={"target": ..., "max_new_tokens": 256}) as p:
        done = p.answers                # {prompt key: answer token ids} read back
        p.append(prompt_key(ids), answer)

The first line is a header naming what the answers depend on (the target's weights, the answer length); a file with
another header belongs to another run and is replaced. Each answer is one `os.write` of one line on an O_APPEND
descriptor, so a kill leaves every earlier line whole and at most the last one cut short; reading drops such a tail
(and truncates it away before anything is appended). An exclusive lock keeps a second convert off the same file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
from pathlib import Path

from eagle_trt.errors import InputError

FORMAT = "eagle-trt-regenerated/1"


def prompt_key(ids: list[int]) -> str:
    """The prompt's identity in the file: a hash of its token ids."""
    return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()[:32]


class Progress:
    def __init__(self, path: str | Path, identity: dict):
        self.path = Path(path)
        # As it reads back from JSON (tuples become lists), so that the comparison on reopening is exact.
        self.header = json.loads(json.dumps({"format": FORMAT, **identity}, default=str))
        self.answers: dict[str, list[int]] = {}
        self._fd: int | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(f"{self.path} is in use by another convert; wait for it, or give this one its own "
                             "--work-dir") from None
        self._fd = fd
        self.answers = self._read()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:  # a thread's answer that arrives after this is not written (and is asked again next run)
            if self._fd is not None:
                os.close(self._fd)  # closing releases the lock
                self._fd = None

    def append(self, key: str, answer: list[int]) -> None:
        self.answers[key] = list(answer)
        self._write({"key": key, "answer": [int(t) for t in answer]})

    def _write(self, row: dict) -> None:
        line = (json.dumps(row, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            written = os.write(self._fd, line)
        if written != len(line):  # a full disk: what was cut is dropped when the file is read back
            raise OSError(f"{self.path}: wrote {written} of {len(line)} bytes (is the disk full?)")

    def _read(self) -> dict[str, list[int]]:
        raw = self.path.read_bytes()
        whole = raw[: raw.rfind(b"\n") + 1]  # a line cut short by a kill is dropped
        lines = whole.decode("utf-8", errors="replace").splitlines()
        header = _parse(lines[0]) if lines else None
        if header != self.header:
            os.ftruncate(self._fd, 0)  # another run's answers (another target or length): start over
            self._write(self.header)
            return {}
        if len(whole) != len(raw):
            os.ftruncate(self._fd, len(whole))
        answers = {}
        for line in lines[1:]:
            row = _parse(line)
            if isinstance(row, dict) and isinstance(row.get("key"), str) and isinstance(row.get("answer"), list):
                answers[row["key"]] = [int(t) for t in row["answer"]]
        return answers


def _parse(line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
