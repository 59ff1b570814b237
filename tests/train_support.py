"""What the training tests share: tiny chat data, one thread per test process, and for the torch.distributed tests
the environment their ranks run in, waiting on them, and which sockets they listen on (read from /proc, so a test
can require every listener of a run to be on the loopback).

    from train_support import one_thread, write_chats   # one_thread: an autouse fixture, active where imported
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import struct
import subprocess
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
WORDS = "the cat sat on a mat and then ran to the big red house where a dog slept all day".split()


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def write_chats(path: Path, answer_words: list[int], seed: int = 0) -> Path:
    """One chat per entry of `answer_words` (6-word question, that many answer words, from WORDS), as JSONL."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for n in answer_words:
            q = " ".join(rng.choice(WORDS) for _ in range(6))
            a = " ".join(rng.choice(WORDS) for _ in range(n))
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                    + "\n")
    return path


@pytest.fixture(scope="module")
def varied_chats(tmp_path_factory):
    """30 chats whose answers differ in length: ranks hold unequal tokens."""
    return write_chats(tmp_path_factory.mktemp("data") / "chats.jsonl", [4 + i for i in range(30)])

# A collective that waits on a rank which never comes fails after EAGLE_TRT_DIST_TIMEOUT_S: a broken stop protocol
# fails the test instead of leaving processes behind.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "EAGLE_TRT_DIST_TIMEOUT_S": "90",
       "EAGLE_TRT_SHUTDOWN_TIMEOUT_S": "20",
       "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def tcp_entry(line: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int, str, str]:
    """(local address, port, state, inode) of a /proc/net/tcp or tcp6 line: the address is printed as 32-bit words
    in the host's byte order."""
    fields = line.split()
    ip_hex, port_hex = fields[1].split(":")
    packed = b"".join(struct.pack("=I", int(ip_hex[i:i + 8], 16)) for i in range(0, len(ip_hex), 8))
    return ipaddress.ip_address(packed), int(port_hex, 16), fields[3], fields[9]


def is_loopback(ip) -> bool:
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def process_tree(pid: int) -> set[int]:
    """pid and its descendants alive now."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue  # exited
        for t in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                pass
    return out


def listeners(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in state LISTEN (0A) that one of `pids` holds open."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            ip, port, state, inode = tcp_entry(line)
            if state == "0A" and inode in inodes:
                out.add((str(ip), port))
    return out


def watch_listeners(proc: subprocess.Popen, timeout: float = 300) -> set[tuple[str, int]]:
    """Every listener the process and its children held while it ran (sampled every 50 ms until it exits)."""
    seen, deadline = set(), time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= listeners(process_tree(proc.pid))
        time.sleep(0.05)
    return seen


def assert_loopback_only(seen: set[tuple[str, int]]) -> None:
    assert seen, "no listener seen: gloo's own listener on the loopback should have been"
    assert all(is_loopback(ipaddress.ip_address(ip)) for ip, _ in seen), seen


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until `path` exists (training is under way); the test fails if the process exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = finish(proc, 1) if proc.poll() is None else proc.communicate()
            pytest.fail(f"{path.name} never appeared (exit {proc.returncode}): {(err or out or '')[-3000:]}")
        time.sleep(0.01)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """The process's output once it exits; past the timeout it is stopped (SIGTERM: the launcher passes it on to its
    workers and kills them after its shutdown timeout), then the test fails."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
