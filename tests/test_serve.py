"""`eagle-trt serve` against the official `openai` client: a server this test starts on a free port of 127.0.0.1,
on the tiny engine; every request bounded in tokens and time."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from serve_support import TIMEOUT
from serve_support import Server as ServeProcess

from eagle_trt.cli.app import app
from eagle_trt.serve.stops import StopScanner

openai = pytest.importorskip("openai")
PROMPTS = ["hello there", "count to five", "a b c d e", "why is the sky blue"]


class Server(ServeProcess):
    def client(self, key: str = "none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def server(engine):
    s = Server(engine, "--max-queue", "16")
    yield s
    s.stop()


def solo(engine: Path, prompt: str, n: int, chat: bool = True) -> str:
    """What `run --mode ar` prints for this prompt alone."""
    r = CliRunner().invoke(app, ["run", "--engine", str(engine), "--prompt", prompt, "--max-new-tokens", str(n),
                                 "--mode", "ar", "--json", "--chat" if chat else "--no-chat"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["text"]


def test_chat_equals_plain_decoding_alone(server, engine):
    c = server.client()
    assert [m.id for m in c.models.list().data] == ["tiny"]
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=24)
    assert r.choices[0].message.content == solo(engine, PROMPTS[0], 24)
    assert r.usage.completion_tokens <= 24 and r.choices[0].finish_reason in ("stop", "length")
    assert r.model_extra["eagle_trt"]["mode"] == "eagle"


def test_streaming_gives_the_same_text_and_usage(server, engine):
    c = server.client()
    chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[1]}],
                                            max_tokens=20, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == solo(engine, PROMPTS[1], 20)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 20
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] in ("stop", "length")


def test_completion_and_a_stop_string_across_tokens(server, engine):
    c = server.client()
    whole = solo(engine, PROMPTS[2], 30, chat=False)
    r = c.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=30)
    assert r.choices[0].text == whole
    stop = whole[len(whole) // 2: len(whole) // 2 + 3]
    if len(stop) < 3:
        pytest.skip("the tiny model's answer is too short to cut")
    cut = c.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=30, stop=[stop])
    assert cut.choices[0].text == whole[:whole.find(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt=PROMPTS[2], max_tokens=30, stop=[stop], stream=True) if ch.choices)
    assert streamed == cut.choices[0].text


def test_concurrent_requests_each_equal_their_solo_answer(server, engine):
    want = {p: solo(engine, p, 8 + 4 * i) for i, p in enumerate(PROMPTS)}
    got, errors = {}, []

    def ask(i: int, p: str) -> None:
        try:
            r = server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}],
                                                        max_tokens=8 + 4 * i)
            got[p] = r.choices[0].message.content
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i % len(PROMPTS), p)) for i, p in enumerate(PROMPTS * 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not errors and got == want
    # They shared engine steps: some step ran more than one request.
    steps = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'eagle_trt:iteration_requests_bucket\{le="([0-9.]+)"\} ([0-9.e+]+)', server.get("/metrics"))}
    assert steps["1.0"] < steps["256.0"]


@pytest.mark.parametrize("body, status, says", [
    ({"model": "tiny", "messages": []}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n must be 1"),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 5}, 400, "temperature"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "presence_penalty": 1}, 400,
     "presence_penalty is not supported"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}, 400, "max_output_len"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi " * 500}]}, 400, "max_input_len"),
    ({"model": "other", "messages": [{"role": "user", "content": "hi"}]}, 404, "does not exist"),
    ({"model": "tiny", "messages": "hi"}, 400, "messages"),
    (b"{not json", 400, "not valid JSON"),
])
def test_bad_requests_get_openai_errors(server, body, status, says):
    code, doc = server.post("/v1/chat/completions", body)
    assert code == status and says in doc["error"]["message"], doc
    assert set(doc["error"]) == {"message", "type", "param", "code"}


def test_a_client_that_leaves_mid_stream_frees_the_engine(server):
    stream = server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPTS[3]}], max_tokens=120, stream=True)
    next(iter(stream))
    stream.close()
    t = time.monotonic()
    r = server.client().completions.create(model="tiny", prompt="x", max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length") and time.monotonic() - t < TIMEOUT
    # The answer reaches the client before its slot is released: poll the gauge (bounded) rather than read it once.
    deadline = time.monotonic() + TIMEOUT
    metrics = server.get("/metrics")
    while "eagle_trt:num_requests_running 0.0" not in metrics and time.monotonic() < deadline:
        time.sleep(0.05)
        metrics = server.get("/metrics")
    assert "eagle_trt:spec_decode_num_accepted_tokens_total" in metrics and "eagle_trt:num_requests_running 0.0" in metrics


def test_api_key_and_drain_on_sigterm(engine):
    s = Server(engine, "--api-key", "sekret")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        stream = s.client("sekret").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=40, stream=True)
        first = next(iter(stream))
        s.proc.send_signal(signal.SIGTERM)  # the running answer still finishes
        rest = list(stream)
        assert first and rest and [c.choices[0].finish_reason for c in rest if c.choices][-1] in ("stop", "length")
    finally:
        assert s.stop() == 0


def test_stop_scanner_holds_back_what_may_start_a_stop():
    s = StopScanner(["</s>"])
    assert [s.push(p) for p in ("ab<", "/", "x")] == ["", "a", "b"] and not s.stopped and s.flush() == "</x"
    s = StopScanner(["STOP"])
    assert s.push("one ST") == "one" and s.push("OP two") == " " and s.stopped and s.flush() == ""
    assert StopScanner([]).push("abc") == "abc"


def test_mode_ar_decodes_plainly(server, engine):
    code, doc = server.post("/v1/chat/completions", {"model": "tiny", "mode": "ar", "max_tokens": 12,
                                                     "messages": [{"role": "user", "content": PROMPTS[0]}]})
    assert code == 200 and doc["eagle_trt"]["mode"] == "ar" and doc["eagle_trt"]["accepted_draft_tokens"] == 0
    assert doc["choices"][0]["message"]["content"] == solo(engine, PROMPTS[0], 12)


def test_bench_serve_checks_every_answer_and_reports_each_level(server, tmp_path):
    prompts = tmp_path / "short.jsonl"  # the tiny engine takes 64 prompt tokens
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:2]))
    r = CliRunner().invoke(app, ["bench-serve", "--url", server.url, "--prompts", str(prompts), "--concurrency",
                                 "1,2", "--requests", "2", "--repeats", "2", "--max-tokens", "8", "--json", "--out",
                                 str(tmp_path / "bs")])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["mismatches"] == [] and [(lv["concurrency"], lv["mode"]) for lv in res["levels"]] == [
        (1, "ar"), (1, "eagle"), (2, "ar"), (2, "eagle")]
    assert all(lv["requests"] == 4 and lv["output_tokens"] > 0 and len(lv["output_tokens_per_s_runs"]) == 2
               for lv in res["levels"])
    assert res["ratios"]["1"]["ar_over_c1_ar"] == 1.0 and res["ratios"]["2"]["eagle_over_ar"] > 0
    assert (tmp_path / "bs" / "report.md").read_text().count("| 2 |") == 3  # two levels, one ratio row


@pytest.mark.parametrize("url", ["http://10.1.2.3:8000", "https://127.0.0.1:8000", "http://example.com:80"])
def test_bench_serve_only_targets_this_machine(url):
    r = CliRunner().invoke(app, ["bench-serve", "--url", url])
    assert r.exit_code == 2 and "must be http://127.0.0.1:PORT" in r.stderr


def test_the_engine_thread_opens_the_session_it_runs(engine):
    # The kernels' OpenMP threads serve the thread that first used them at full speed (docs/bench.md): the engine
    # must be opened where it runs, not in the thread that starts the server.
    from eagle_trt.runtime.session import Session
    from eagle_trt.serve.worker import EngineWorker

    seen, opened = [], []
    w = EngineWorker(lambda: seen.append(threading.current_thread()) or opened.append(Session.open(engine))
                     or opened[0])
    assert w.start_and_wait() is opened[0] and seen == [w]
    assert w.batch.budget.measured is not None  # the verify-cost curve, measured on the engine thread too
    w.stop()
    w.join(10)
    failing = EngineWorker(lambda: (_ for _ in ()).throw(RuntimeError("no engine")))
    with pytest.raises(RuntimeError, match="no engine"):
        failing.start_and_wait()


def test_serve_refuses_bad_batch_settings(engine):
    for args, says in ((["--kv-cache-memory", "lots"], "--kv-cache-memory: not a size"),
                       (["--max-batch", "0"], "--max-batch must be in [1, 256]")):
        r = CliRunner().invoke(app, ["serve", "--engine", str(engine), *args])
        assert r.exit_code == 2 and says in r.output, r.output


def test_a_request_beyond_the_kv_budget_is_a_400_and_one_that_fits_runs(engine):
    s = Server(engine, "--kv-cache-memory", "200KB")  # the tiny model: ~1 KiB of KV a token
    try:
        ok, body = s.post("/v1/chat/completions", {"model": "tiny", "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "hi"}]})
        assert ok == 200 and body["usage"]["completion_tokens"] >= 1, body
        status, body = s.post("/v1/chat/completions", {"model": "tiny", "max_tokens": 120,
                                                       "messages": [{"role": "user", "content": "hi " * 10}]})
        assert status == 400 and "--kv-cache-memory" in body["error"]["message"], body
    finally:
        s.stop()
