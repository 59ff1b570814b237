"""`eagle-trt serve` under hostile clients: bodies bounded by the bytes received (chunked or not) while /health stays
prompt, a whole answer cancelled when its client leaves, bad text and wrong types answered 400 in OpenAI's shape
(anything unexpected a 500 in that shape, without the traceback), the API key checked as RFC 7235 and in constant
time, an exposed address refused without a key, and a drain that idle connections do not hold. Servers bind
127.0.0.1; every request is bounded in size and time."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from serve_support import TIMEOUT, HealthProbe, Server, chunked, raw_exchange, request_head

from eagle_trt.cli.app import app

ERROR_KEYS = {"message", "type", "param", "code"}
HEALTH_BOUND = 0.25  # seconds: the slowest /health answer allowed while the server is loaded


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("hostile-serve"))


@pytest.fixture(scope="module")
def server(engine):
    s = Server(engine, "--max-queue", "16", "--threads", "1")
    yield s
    s.stop()


def openai_error(status: int, body: bytes | dict, code: int) -> dict:
    doc = json.loads(body) if isinstance(body, bytes) else body
    assert status == code and set(doc["error"]) == ERROR_KEYS, (status, doc)
    assert "Traceback" not in json.dumps(doc)
    return doc["error"]


def metric(server: Server, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", server.get("/metrics"), re.M)
    return float(m.group(1)) if m else 0.0


def wait_idle(server: Server) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if metric(server, "eagle_trt:num_requests_running") == 0 and metric(
                server, "eagle_trt:num_requests_waiting") == 0:
            return
        time.sleep(0.02)
    pytest.fail("the server did not become idle")


# ---- 1. bodies bounded by the bytes received; the event loop stays free --------------------------------------------

CHAT_HEAD = b'{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "'
CHAT_TAIL = b'"}]}'


@pytest.mark.parametrize("framing, size, code", [("chunked", 6 * 2**20, 413), ("length", 3_900_000, 400)])
def test_a_large_body_is_refused_and_health_answers_meanwhile(server, framing, size, code):
    # chunked: past the 4 MiB limit with no Content-Length to say so; length: under it, a message far longer than
    # max_input_len tokens can spell.
    pieces = [CHAT_HEAD, *[b"a" * 65536] * (size // 65536), CHAT_TAIL]
    headers = {"content-type": "application/json"}
    if framing == "chunked":
        headers["transfer-encoding"] = "chunked"
        body = chunked(pieces)
    else:
        headers["content-length"] = str(sum(map(len, pieces)))
        body = pieces
    with HealthProbe(server.url, pid=server.proc.pid) as probe:
        time.sleep(0.2)
        status, _, answer = raw_exchange(server.port, request_head("POST", "/v1/chat/completions", headers), body)
        time.sleep(0.2)
    error = openai_error(status, answer, code)
    assert ("larger than" if code == 413 else "max_input_len") in error["message"]
    assert not probe.failures and len(probe.latencies) >= 4
    # The loop's own CPU time tells a loop held by work (tokenizing on it) from a server a loaded machine starved.
    assert probe.held(HEALTH_BOUND) < HEALTH_BOUND, probe.describe()


# ---- 2. a whole answer stops when its client leaves -------------------------------------------------------------

def test_a_whole_answer_stops_generating_when_its_client_leaves(server):
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 120, "mode": "ar"}
    status, whole = server.post("/v1/completions", body)
    full = whole["usage"]["completion_tokens"]
    assert status == 200 and full > 60  # what it generates when its client stays
    wait_idle(server)
    before = metric(server, "eagle_trt:generation_tokens_total")
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    sock.sendall(request_head("POST", "/v1/completions", {"content-type": "application/json",
                                                          "content-length": len(data)}) + data)
    deadline = time.monotonic() + TIMEOUT
    while metric(server, "eagle_trt:num_requests_running") < 1:  # leave once it is decoding
        assert time.monotonic() < deadline
    sock.close()
    wait_idle(server)
    generated = metric(server, "eagle_trt:generation_tokens_total") - before
    assert 0 < generated < full / 2, (generated, full)


# ---- 3. bad text and the catch-all --------------------------------------------------------------------------------

def _chat(content) -> dict:
    return {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}


@pytest.mark.parametrize("path, body, says", [
    ("/v1/chat/completions", json.dumps(_chat("a\ud800b")).encode(), "not valid JSON"),
    ("/v1/chat/completions", json.dumps(_chat([{"type": "text", "text": "\udfff"}])).encode(), "not valid JSON"),
    ("/v1/completions", json.dumps({"model": "tiny", "prompt": "x\udc00"}).encode(), "not valid JSON"),
    ("/v1/completions", json.dumps({"model": "tiny", "prompt": "x", "stop": ["\ud83d"]}).encode(), "not valid JSON"),
    ("/v1/completions", json.dumps({"model": "\ud800", "prompt": "x"}).encode(), "not valid JSON"),
    ("/v1/chat/completions", CHAT_HEAD + b"caf\xe9" + CHAT_TAIL, "not valid JSON"),
    ("/v1/chat/completions", CHAT_HEAD + b"\xed\xa0\x80" + CHAT_TAIL, "not valid JSON"),
    ("/v1/chat/completions", json.dumps(_chat("  \n")).encode(), "no text"),
    ("/v1/completions", json.dumps({"model": "tiny", "prompt": " "}).encode(), "prompt is empty"),
    ("/v1/chat/completions", json.dumps(_chat([{"type": "image_url", "image_url": "x"}])).encode(), "text content"),
    ("/v1/chat/completions", b"[1, 2]", "JSON object"),
])
def test_bad_text_is_a_400_in_openai_shape(server, path, body, says):
    status, doc = server.post(path, body)
    assert says in openai_error(status, doc, 400)["message"]


def test_an_unexpected_exception_is_an_openai_500_logged_with_an_id(caplog):
    from starlette.testclient import TestClient

    from eagle_trt.serve.app import make_app
    from eagle_trt.serve.metrics import ServeMetrics

    class Exploding:
        chat_template = None

        def get_vocab(self):
            return {"ab": 0}

        def __call__(self, text):
            raise RuntimeError("the tokenizer's secret internals")

    session = SimpleNamespace(tokenizer=Exploding(), config=SimpleNamespace(max_input_len=64, max_output_len=8))
    worker = SimpleNamespace(stopping=threading.Event(), metrics=ServeMetrics())
    with TestClient(make_app(session, worker, "tiny")) as client:
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
    error = openai_error(r.status_code, r.content, 500)
    eid = re.search(r"id ([0-9a-f]{12})", error["message"]).group(1)
    assert error["type"] == "server_error" and "secret" not in r.text
    assert any(eid in rec.getMessage() and "RuntimeError" in rec.getMessage() for rec in caplog.records)


# ---- 4. the API key ---------------------------------------------------------------------------------------------

def test_the_key_is_compared_in_constant_time_and_the_scheme_in_any_case(monkeypatch):
    import hmac

    from starlette.testclient import TestClient

    from eagle_trt.serve.app import make_app
    from eagle_trt.serve.metrics import ServeMetrics

    compared, real = [], hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    session = SimpleNamespace(tokenizer=SimpleNamespace(get_vocab=lambda: {"a": 0}),
                              config=SimpleNamespace(max_input_len=8))
    worker = SimpleNamespace(stopping=threading.Event(), metrics=ServeMetrics())
    with TestClient(make_app(session, worker, "tiny", api_key="sekret")) as client:
        codes = {auth: client.get("/v1/models", headers={"authorization": auth} if auth else {}).status_code
                 for auth in ("Bearer sekret", "bearer sekret", "BEARER  sekret", "Bearer wrong", "Basic sekret",
                              "sekret", "")}
        open_paths = [client.get(p).status_code for p in ("/health", "/metrics")]
    assert codes == {"Bearer sekret": 200, "bearer sekret": 200, "BEARER  sekret": 200, "Bearer wrong": 401,
                     "Basic sekret": 401, "sekret": 401, "": 401}
    assert compared and open_paths == [200, 200]  # /health and /metrics answer without the key, as vLLM's do


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.com"])
def test_an_exposed_address_without_a_key_is_refused(engine, host):
    # --max-batch 0: a server that did not refuse the address stops at that setting instead of serving it.
    r = CliRunner().invoke(app, ["serve", "--engine", str(engine), "--host", host, "--max-batch", "0"])
    assert r.exit_code == 2 and "--api-key" in r.stderr and "--allow-unauthenticated" in r.stderr, r.output
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1


def test_loopback_addresses_are_told_apart():
    from eagle_trt.cli.serve_cmd import is_loopback

    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "localhost", "0.0.0.0", "::", "10.0.0.1",
                                     "localhost.example.com")] == [True] * 4 + [False] * 4


# ---- 5. strict types and type-aware neutral values ----------------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path, body, says", [
    ("/v1/chat/completions", {"messages": HI, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": "4"}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 4.0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"messages": HI, "stream": 1}, "stream"),
    ("/v1/chat/completions", {"messages": HI, "temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", {"messages": HI, "temperature": False}, "temperature"),
    ("/v1/chat/completions", {"messages": HI, "seed": True}, "seed"),
    ("/v1/chat/completions", {"messages": HI, "n": True}, "n"),
    ("/v1/chat/completions", {"messages": HI, "stream_options": {"include_usage": "true"}}, "include_usage"),
    ("/v1/chat/completions", {"messages": HI, "model": 5}, "model"),
    ("/v1/chat/completions", {"messages": HI, "presence_penalty": False}, "presence_penalty is not supported"),
    ("/v1/chat/completions", {"messages": HI, "logprobs": True}, "logprobs is not supported"),
    ("/v1/chat/completions", {"messages": HI, "logprobs": 0}, "logprobs is not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, "messages.0.content: must be a string"),
    ("/v1/completions", {"prompt": [True, False]}, "prompt: must be a string"),
    ("/v1/completions", {"prompt": [1, 2.0]}, "prompt: must be a string"),
    ("/v1/completions", {"prompt": "x", "logprobs": 0}, "logprobs is not supported"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1}, "logprobs is not supported"),
    ("/v1/completions", {"prompt": "x", "echo": 0}, "echo is not supported"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "stop: must be a string"),
])
def test_wrong_types_are_never_coerced(server, path, body, says):
    status, doc = server.post(path, {"model": "tiny", **body})
    assert says in openai_error(status, doc, 400)["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": HI, "temperature": 0, "top_p": 1, "presence_penalty": 0,
                              "frequency_penalty": 0.0, "logprobs": False, "top_logprobs": 0, "logit_bias": {},
                              "tools": [], "stream": False, "user": "u", "metadata": {"k": "v"}}),
    ("/v1/completions", {"prompt": "x", "temperature": 1, "seed": 3, "logprobs": None, "echo": False, "best_of": 1,
                         "suffix": ""}),
])
def test_neutral_values_of_their_own_type_are_accepted(server, path, body):
    status, doc = server.post(path, {"model": "tiny", "max_tokens": 2, **body})
    assert status == 200 and doc["usage"]["completion_tokens"] >= 1, doc


# ---- 8. the drain ---------------------------------------------------------------------------------------------

def test_sigterm_exits_promptly_with_only_idle_connections(engine):
    s = Server(engine, "--drain-seconds", "60")
    try:
        held = []
        for stream in (False, True):  # keep-alive connections that each carried a whole answer
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
            data = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 4, "stream": stream}).encode()
            sock.sendall(request_head("POST", "/v1/completions", {"content-type": "application/json",
                                                                  "content-length": len(data)}) + data)
            answer = b""
            while not (answer.endswith(b"}") or answer.endswith(b"0\r\n\r\n")):
                piece = sock.recv(65536)
                assert piece, answer
                answer += piece
            held.append(sock)
        held.append(socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT))  # one that sent nothing
        stalled = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)  # a body that stops coming
        stalled.sendall(request_head("POST", "/v1/completions", {"content-type": "application/json",
                                                                 "content-length": 100}) + b'{"prompt": ')
        time.sleep(0.3)
        t = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        try:
            code = s.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - still running: reported below
            code = None
        took = time.monotonic() - t
        assert code == 0 and took < 2, f"exit {code} after {took:.1f} s"
        reply = stalled.recv(65536)
        assert reply.startswith(b"HTTP/1.1 503") and b"shutting down" in reply, reply
    finally:
        s.stop()


def test_a_failed_engine_step_tells_the_client_no_internals(caplog):
    """A step that raised: the request's fault is a 400 with the engine's one line, the model's a 500 with it; any
    other exception a 500 that names only an id, which the server's log carries with the exception."""
    from eagle_trt.errors import CheckpointError, InputError
    from eagle_trt.serve.worker import _api_error

    assert (_api_error(InputError("too long")).status, _api_error(InputError("too long")).body()["error"]["message"]) \
        == (400, "too long")
    assert _api_error(CheckpointError("hidden states overflow")).status == 500
    with caplog.at_level("ERROR", logger="eagle_trt.serve"):
        e = _api_error(KeyError("secret internals at 0x7f"))
    message = e.body()["error"]["message"]
    assert e.status == 500 and "secret" not in message and "KeyError" not in message
    eid = message.split("(id ")[1].split(")")[0]
    assert any(eid in r.getMessage() and "secret internals" in r.getMessage() for r in caplog.records)
