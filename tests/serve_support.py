"""`eagle-trt serve` processes for the tests: started on a free port of 127.0.0.1 over an engine the test built, asked
over HTTP with bounded timeouts, stopped with SIGTERM; and a forwarder that makes a real server look flaky.

    s = Server(engine, "--max-queue", "16"); status, body = s.post("/v1/completions", {...}); s.stop()
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
