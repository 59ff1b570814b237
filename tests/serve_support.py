"""`eagle-trt serve` processes for the tests: started on a free port of 127.0.0.1 over an engine the test built, asked
over HTTP with bounded timeouts, stopped with SIGTERM; a forwarder that makes a real server look flaky; a /health
probe that times every answer while a test loads the server; and requests written byte by byte on a raw socket.

    s = Server(engine, "--max-queue", "16"); status, body = s.post("/v1/completions", {...}); s.stop()
    with HealthProbe(s.url, pid=s.proc.pid) as probe: ...; assert probe.held(0.25) < 0.25
    status, headers, body = raw_exchange(s.port, head, chunked([b"{...", b"...}"]))
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds a server start or one request may take


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`eagle-trt serve` in its own process on a free port of 127.0.0.1."""

    def __init__(self, engine: Path, *extra: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "eagle_trt", "serve", "--engine", str(engine), "--port",
                                      "0", *extra], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "EAGLE_TRT_DEBUG": "1"})
        deadline, line = time.monotonic() + TIMEOUT, ""
        while "serving" not in line:
            line = self.proc.stderr.readline()
            if (not line and self.proc.poll() is not None) or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the server did not start: {line}")
        self.url = line.split(" on ")[1].split()[0]
        assert self.url.startswith("http://127.0.0.1:")
        self.port = int(self.url.rsplit(":", 1)[1])
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep its pipe drained

    def post(self, path: str, body, headers: dict | None = None) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=TIMEOUT) as r:
            return r.read().decode()

    def finished(self) -> int:
        """Requests the server finished (its Prometheus count), once nothing runs or waits."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            with urllib.request.urlopen(self.url + "/metrics", timeout=TIMEOUT) as r:
                text = r.read().decode()
            idle = "eagle_trt:num_requests_running 0.0" in text and "eagle_trt:num_requests_waiting 0.0" in text
            if idle or time.monotonic() > deadline:
                m = re.search(r"^eagle_trt:e2e_request_latency_seconds_count ([0-9.e+]+)$", text, re.M)
                return int(float(m.group(1))) if m else 0
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM (the server drains), a kill after 60 s; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


class Flaky:
    """A forwarder on 127.0.0.1 to a real server that answers 503 to the first `fail_first` completions, or to all
    after the first `die_after` (what a restarting, overloaded or dying server does), and passes the rest through."""

    def __init__(self, upstream: str, fail_first: int = 0, die_after: int | None = None):
        self.failed = self.answered = 0
        lock, flaky = threading.Lock(), self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _forward(self, method):
                body = self.rfile.read(int(self.headers.get("content-length") or 0)) or None
                if method == "POST":
                    with lock:
                        fail = flaky.failed < fail_first or (die_after is not None and flaky.answered >= die_after)
                        flaky.failed += fail
                        flaky.answered += not fail
                    if fail:
                        self.send_response(503)
                        self.send_header("content-length", "0")
                        self.end_headers()
                        return
                req = urllib.request.Request(upstream + self.path, data=body, method=method,
                                             headers={"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                    data, status = r.read(), r.status
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


PROBE = """
import os, sys, time, urllib.request
url, every, pid = sys.argv[1], float(sys.argv[2]), sys.argv[3]
TICK = os.sysconf("SC_CLK_TCK")
def loop_cpu():
    # utime + stime of the server's main thread (its event loop), in seconds; nan where /proc cannot say
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, ValueError, IndexError):
        return float("nan")
while True:
    t, c = time.perf_counter(), loop_cpu()
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            r.read()
        outcome = "ok"
    except Exception as e:
        outcome = repr(e).replace(chr(10), " ")
    print(time.perf_counter() - t, loop_cpu() - c, outcome, flush=True)
    time.sleep(every)
"""


class HealthProbe:
    """GET /health every `every` seconds from a process of its own (so the test's own work does not slow the
    probe) while the block runs: how many answered, the slowest (seconds, connection included), and any that
    failed. `doing`, set by the test, is recorded beside the slowest.

    With the server's `pid`, each probe also records the CPU time the server's event-loop thread (its main thread)
    spent while the probe waited. A loop held by work (a body parsed, a prompt tokenized on it) spends that whole
    wait on the CPU; a server that merely waited for a core on a loaded machine spends little of it. `held` is the
    slowest probe of the first kind, the one a test bounds: the verdict is then the server's, not the machine's
    load's (README, "Tests")."""

    def __init__(self, url: str, every: float = 0.05, pid: int | None = None):
        self.url, self.every, self.pid = url, every, pid
        self.latencies: list[float] = []
        self.loop_cpu: list[float] = []  # per probe: the event loop's CPU seconds during it (nan: unknown)
        self.failures: list[str] = []
        self.doing = ""
        self.slowest_during = ""
        self._proc: subprocess.Popen | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        for line in self._proc.stdout:
            took, cpu, outcome = line.strip().split(" ", 2)
            if outcome != "ok":
                self.failures.append(f"{outcome} during {self.doing}")
            if float(took) > self.worst:
                self.slowest_during = self.doing
            self.latencies.append(float(took))
            self.loop_cpu.append(float(cpu))

    def held(self, bound: float) -> float:
        """The slowest probe whose wait the event loop spent at least half of on the CPU (every probe where the
        loop's CPU time is unknown): what `bound` applies to."""
        return max((t for t, c in zip(self.latencies, self.loop_cpu) if not c < bound / 2), default=0.0)

    def describe(self) -> str:
        """The slowest probe, and how much of its wait the server's event loop spent on the CPU."""
        i = max(range(len(self.latencies)), key=self.latencies.__getitem__, default=None)
        if i is None:
            return "no probe answered"
        return (f"slowest {1000 * self.latencies[i]:.0f} ms, of which the event loop ran {1000 * self.loop_cpu[i]:.0f}"
                f" ms on the CPU (during {self.slowest_during})")

    def __enter__(self) -> "HealthProbe":
        self._proc = subprocess.Popen([sys.executable, "-c", PROBE, self.url, str(self.every), str(self.pid or 0)],
                                      stdout=subprocess.PIPE, text=True)
        self._reader.start()
        return self

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        self._proc.wait(15)
        self._reader.join(15)

    @property
    def worst(self) -> float:
        return max(self.latencies, default=0.0)


def chunked(parts):
    """A body in HTTP/1.1 chunked transfer encoding: one chunk per part, then the last (empty) chunk."""
    for part in parts:
        if part:
            yield b"%x\r\n" % len(part) + part + b"\r\n"
    yield b"0\r\n\r\n"


def request_head(method: str, path: str, headers: dict) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def raw_exchange(port: int, head: bytes, body=(), timeout: float = TIMEOUT) -> tuple[int, dict, bytes]:
    """One request on a fresh socket to 127.0.0.1: the head, then the body's pieces, while a thread reads the
    answer, so an answer the server gives before it has read the whole body (413) is seen, and the sending stops
    there. (status, headers, body); the answer ends at its content-length, at the last chunk, or when the server
    closes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    got, done = bytearray(), threading.Event()

    def read() -> None:
        try:
            while not _complete(got):
                data = sock.recv(65536)
                if not data:
                    break
                got.extend(data)
        except OSError:
            pass  # reset after the answer (the server closes with the body unread) or timed out
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for piece in [head, *body]:
            if done.is_set() or _complete(got):
                break
            sock.sendall(piece)
    except OSError:
        pass  # the server answered and closed while the body was still being sent
    done.wait(timeout)
    sock.close()
    return _parse_answer(bytes(got))


def _final(data: bytes) -> bytes:
    """The answer without the interim ones before it (100 Continue)."""
    while re.match(rb"HTTP/1\.[01] 1\d\d[^\r]*\r\n(?:[^\r]+\r\n)*\r\n", data):
        data = data.partition(b"\r\n\r\n")[2]
    return data


def _complete(data: bytearray) -> bool:
    head, sep, rest = _final(bytes(data)).partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if m:
        return len(rest) >= int(m.group(1))
    return rest.endswith(b"0\r\n\r\n") if re.search(rb"(?im)^transfer-encoding:\s*chunked", head) else False


def _parse_answer(data: bytes) -> tuple[int, dict, bytes]:
    head, _, rest = _final(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1."):
        return 0, {}, data  # no answer
    headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
    headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
    if headers.get("transfer-encoding") == "chunked":
        body, rest = bytearray(), bytes(rest)
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            body += rest[:n]
            rest = rest[n + 2:]
        rest = bytes(body)
    return int(lines[0].split()[1]), headers, rest
