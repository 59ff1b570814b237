"""Property-based tests of `eagle-trt serve` as hostile clients meet it: generated OpenAI request bodies (valid and
broken shapes, types, sizes and encodings) in generated framings (Content-Length or chunked) and headers, against
ONE live server on 127.0.0.1.

The invariant for each: a 2xx (for a greedy body, the text `run --mode ar` gives for the prompt alone), or a 4xx in
OpenAI's error shape; never a 5xx, a hang (every exchange is bounded in time) or, while they run, a /health answer
slower than 250 ms (a probe process asks every 50 ms for the whole module). The server has an API key, so the
key's check is fuzzed too. Each property runs `EXAMPLES` inputs (EAGLE_TRT_FUZZ_SERVER_EXAMPLES overrides),
derandomized; `pytest -m fuzz_long tests/test_fuzz_server.py` runs `LONG_EXAMPLES` (three inputs each;
EAGLE_TRT_FUZZ_SERVER_LONG_EXAMPLES overrides). The last test prints how many inputs ran and the slowest /health
answer.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from serve_support import HealthProbe, Server, chunked, raw_exchange, request_head

from eagle_trt.cli.app import app

EXAMPLES = int(os.environ.get("EAGLE_TRT_FUZZ_SERVER_EXAMPLES", "300"))
LONG_EXAMPLES = int(os.environ.get("EAGLE_TRT_FUZZ_SERVER_LONG_EXAMPLES", "3000"))
HEALTH_BOUND = 0.25  # seconds
EXCHANGE_TIMEOUT = 30  # seconds one request may take before it counts as a hang


def fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


PROMPTS = ["hello there", "count to five", "a b c d e"]
MAX_TOKENS = 6
SEEN: Counter = Counter()  # statuses answered, over the module


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("fuzz-serve"))


@pytest.fixture(scope="module")
def server(engine):
    s = Server(engine, "--max-queue", "16", "--threads", "1", "--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def probe(server):
    with HealthProbe(server.url, pid=server.proc.pid) as p:
        yield p


@pytest.fixture(scope="module")
def solo(engine):
    """(chat, prompt) -> what `run --mode ar` prints for the prompt alone, MAX_TOKENS tokens."""
    answers = {}
    for chat in (True, False):
        for prompt in PROMPTS:
            r = CliRunner().invoke(app, ["run", "--engine", str(engine), "--prompt", prompt, "--max-new-tokens",
                                         str(MAX_TOKENS), "--mode", "ar", "--json", "--chat" if chat else "--no-chat"])
            assert r.exit_code == 0, r.output
            answers[chat, prompt] = json.loads(r.stdout)["text"]
    return answers


# ---- what is sent --------------------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12))
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                           st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                           max_leaves=12)
FIELDS = ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
          "stream_options", "n", "mode", "return_token_ids", "messages", "prompt", "presence_penalty", "logprobs",
          "top_logprobs", "echo", "logit_bias", "tools", "response_format", "best_of", "suffix", "user"]
SIZES = [0, 300, 5000, 200_000, 4 * 2**20 + 10]  # characters of padding: fits, too long to tokenize, over 4 MiB

greedy_extras = st.fixed_dictionaries({}, optional={
    "temperature": st.just(0), "top_p": st.floats(0.05, 1), "top_k": st.integers(0, 50),
    "seed": st.integers(0, 2**64 - 1), "stream": st.booleans(), "mode": st.sampled_from(["eagle", "ar"]),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "n": st.just(1),
    "presence_penalty": st.just(0), "user": st.text(max_size=8), "model": st.just("tiny")})


@st.composite
def greedy_bodies(draw) -> tuple[str, dict]:
    chat, prompt = draw(st.booleans()), draw(st.sampled_from(PROMPTS))
    base = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    return ("/v1/chat/completions" if chat else "/v1/completions"), {**base, "max_tokens": MAX_TOKENS,
                                                                      **draw(greedy_extras)}


@st.composite
def broken_bodies(draw) -> tuple[str, object]:
    """A greedy body with fields set to wrong or unsupported values, removed, padded to a size, or not an object."""
    path, body = draw(greedy_bodies())
    if draw(st.integers(0, 9)) == 0:
        return path, draw(json_values)  # not an object at all, mostly
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["set", "drop", "pad", "message"]))
        if how == "set":
            body[draw(st.sampled_from(FIELDS + ["x"]))] = draw(json_values)
        elif how == "drop" and body:
            body.pop(draw(st.sampled_from(sorted(body))))
        elif how == "pad":
            field = draw(st.sampled_from(["prompt", "user", "stop", "messages"]))
            pad = draw(st.sampled_from(SIZES)) * draw(st.sampled_from(["a", "é", "\u2028", " "]))
            body[field] = [{"role": "user", "content": pad}] if field == "messages" else pad
        elif how == "message":
            body["messages"] = draw(st.lists(st.one_of(json_values, st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system", "assistant", "wizard", ""]), "content": json_values})),
                max_size=3))
    return path, body


@st.composite
def raw_bodies(draw) -> bytes:
    """Bytes that are not quite JSON: truncated, spliced with bytes, bad UTF-8, lone surrogates, or none."""
    _, body = draw(greedy_bodies())
    data = json.dumps(body).encode()
    how = draw(st.sampled_from(["truncate", "splice", "latin1", "surrogate", "empty", "binary"]))
    at = draw(st.integers(0, len(data)))
    if how == "truncate":
        return data[:at]
    if how == "splice":
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    if how == "latin1":
        return data.replace(b'"hello', b'"h\xe9llo').replace(b'"count', b'"\xff\xfe').replace(b'"a b', b'"\xc3')
    if how == "surrogate":  # a JSON escape of half a UTF-16 pair, in the prompt's text
        return data.replace(b'"hello', b'"\\ud800hello').replace(b'"count', b'"count\\udc00').replace(
            b'"a b', b'"\\udbff')
    return b"" if how == "empty" else draw(st.binary(max_size=64))


KEY = "fuzz-key"
headers_strategy = st.fixed_dictionaries({
    "authorization": st.sampled_from([f"Bearer {KEY}"] * 6 + [f"bearer {KEY}", f"BEARER   {KEY}", "Bearer x",
                                      "bearer", "Basic Zm9vOmJhcg==", "Bearer " + "k" * 2000, ""]),
}, optional={
    "content-type": st.sampled_from(["application/json"] * 4 + ["text/plain", "application/json; charset=x", ""]),
    "x-request-id": st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
    "accept": st.sampled_from(["*/*", "text/event-stream", "application/xml"]),
    "expect": st.just("100-continue"),
})
framings = st.sampled_from(["length", "chunked"])


# ---- one exchange and its invariant ------------------------------------------------------------------------------

def exchange(server: Server, probe: HealthProbe, method: str, path: str, data: bytes, headers: dict, framing: str,
             pieces: int = 3) -> tuple[int, bytes]:
    headers = {k: v for k, v in headers.items() if k != "expect"} if method != "POST" else dict(headers)
    step = max(1, -(-len(data) // pieces))
    parts = [data[i:i + step] for i in range(0, len(data), step)]
    if framing == "chunked":
        headers["transfer-encoding"] = "chunked"
        body = chunked(parts)
    else:
        headers["content-length"] = str(len(data))
        body = parts
    probe.doing = f"{method} {path} {framing} {len(data)} bytes: {data[:600]!r}"
    status, _, answer = raw_exchange(server.port, request_head(method, path, headers), body, EXCHANGE_TIMEOUT)
    SEEN[status] += 1
    assert status != 0, f"no answer (a hang, or the connection dropped) to {probe.doing}"
    assert status < 500, (status, answer[:300], probe.doing)
    return status, answer


def check_error(status: int, answer: bytes) -> None:
    if 400 <= status < 500:
        doc = json.loads(answer)
        assert set(doc["error"]) == {"message", "type", "param", "code"}, doc
        assert doc["error"]["message"] and "Traceback" not in doc["error"]["message"], doc


def answer_text(answer: bytes, chat: bool) -> str:
    """The text of a whole answer, or of a stream's chunks (each one JSON, the last `[DONE]`)."""
    if answer.startswith(b"data: "):
        events = [e[len(b"data: "):] for e in answer.split(b"\n\n") if e]
        assert events[-1] == b"[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks), chunks
        return "".join((c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
                       for c in chunks if c["choices"])
    doc = json.loads(answer)
    return doc["choices"][0]["message"]["content"] if chat else doc["choices"][0]["text"]


def authorized(headers: dict) -> bool:
    scheme, _, key = headers.get("authorization", "").strip().partition(" ")
    return scheme.lower() == "bearer" and key.strip() == KEY


def check_greedy(server, probe, solo, path, body, headers, framing) -> None:
    status, answer = exchange(server, probe, "POST", path, json.dumps(body).encode(), headers, framing)
    if not authorized(headers):
        assert status == 401, (status, answer[:300], headers)
        return check_error(status, answer)
    assert status == 200, (status, answer[:300], body, headers)  # no other header this server reads refuses it
    chat = path == "/v1/chat/completions"
    prompt = body["messages"][0]["content"] if chat else body["prompt"]
    assert answer_text(answer, chat) == solo[chat, prompt], body


def check_any(server, probe, method, path, data, headers, framing) -> None:
    status, answer = exchange(server, probe, method, path, data, headers, framing)
    check_error(status, answer)
    if status == 200 and path in ("/v1/chat/completions", "/v1/completions"):
        answer_text(answer, path == "/v1/chat/completions")


PATHS = st.sampled_from(["/v1/chat/completions"] * 3 + ["/v1/completions"] * 3 + ["/v1/models", "/v1/nope", "/health"])


def _json_body(path_body) -> bytes:
    return json.dumps(path_body[1], ensure_ascii=False).encode("utf-8", "surrogatepass")


# ---- the properties --------------------------------------------------------------------------------------------

@fuzz(EXAMPLES)
@given(body=greedy_bodies(), headers=headers_strategy, framing=framings)
def test_greedy_bodies_get_the_solo_answer(server, probe, solo, body, headers, framing):
    check_greedy(server, probe, solo, *body, {**headers, "content-type": "application/json"}, framing)


@fuzz(EXAMPLES)
@given(body=broken_bodies(), headers=headers_strategy, framing=framings)
def test_broken_bodies_get_a_4xx_in_openai_shape(server, probe, body, headers, framing):
    check_any(server, probe, "POST", body[0], _json_body(body), headers, framing)


@fuzz(EXAMPLES // 2)
@given(data=raw_bodies(), path=PATHS, method=st.sampled_from(["POST"] * 4 + ["GET", "PUT"]),
       headers=headers_strategy, framing=framings)
def test_raw_bytes_methods_and_paths(server, probe, data, path, method, headers, framing):
    check_any(server, probe, method, path, data, headers, framing)


@pytest.fixture
def long_run(request):
    if "fuzz_long" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the long run: pytest -m fuzz_long tests/test_fuzz_server.py")


@pytest.mark.fuzz_long
@fuzz(LONG_EXAMPLES)
@given(greedy=greedy_bodies(), broken=broken_bodies(), data=raw_bodies(), path=PATHS, headers=headers_strategy,
       framing=framings)
def test_long_run(long_run, server, probe, solo, greedy, broken, data, path, headers, framing):
    check_greedy(server, probe, solo, *greedy, {**headers, "content-type": "application/json"}, framing)
    check_any(server, probe, "POST", broken[0], _json_body(broken), headers, framing)
    check_any(server, probe, "POST", path, data, headers, framing)


@pytest.mark.fuzz_long  # also in the default run: it closes both
def test_health_answered_promptly_throughout(probe, request):
    """Runs last: the slowest /health answer while every input above was sent, and how many inputs there were."""
    summary = (f"server fuzz: {sum(SEEN.values())} inputs (statuses {dict(sorted(SEEN.items()))}); /health asked "
               f"{len(probe.latencies)} times, {probe.describe()}; slowest the loop held: "
               f"{1000 * probe.held(HEALTH_BOUND):.0f} ms")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(summary)
    print(summary)
    assert not probe.failures, probe.failures[:3]
    # Bounded where the server's event loop held the probe (its CPU time during the wait), not where a loaded
    # machine gave the server no core: that is the machine's verdict, not the server's (serve_support.HealthProbe).
    assert probe.held(HEALTH_BOUND) < HEALTH_BOUND, summary
