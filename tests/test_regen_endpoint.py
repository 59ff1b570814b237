"""`convert --regenerate --regenerate-endpoint`: answers from real `eagle-trt serve` processes on 127.0.0.1 over tiny
engines built here, compared with the tiny target's own greedy tokens; a killed convert resumed without asking twice,
a server of another model refused, unreachable URLs named."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from serve_support import REPO, TIMEOUT, Flaky, Server, free_port

from eagle_trt.cli.app import app
from eagle_trt.convert.endpoint_http import base_url
from eagle_trt.convert.regen_endpoint import EndpointOptions, EndpointRegenerator, connect
from eagle_trt.convert.regen_probe import teacher_forced
from eagle_trt.convert.regen_progress import Progress, prompt_key
from eagle_trt.errors import EndpointError

pytest.importorskip("fastapi")
WORDS = ["the cat", "a dog ran", "blue sky", "count", "x y z", "hello", "one two", "tea", "red", "green"]


def build_engine(checkpoint: Path, tmp: Path) -> Path:
    cfg = tmp / "cfg.yaml"  # float32: the same numbers as the local fp32 target, so answers compare exactly
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {checkpoint}\ndtype: float32\nmax_input_len: 64\n"
                   "max_output_len: 128\n")
    r = CliRunner().invoke(app, ["build", "--config", str(cfg), "--output", str(tmp / "engine")])
    assert r.exit_code == 0, r.output
    return tmp / "engine"


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    return build_engine(tiny_checkpoint, tmp_path_factory.mktemp("regen"))


@pytest.fixture(scope="module")
def servers(engine):
    """Two servers of the target's engine (the requests spread over both)."""
    started = [Server(engine), Server(engine)]
    yield started
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def other_server(tmp_path_factory):
    """A server of another tiny model (other random weights, same tokenizer and shapes) under the target's name."""
    from make_tiny_model import make_tiny_model

    tmp = tmp_path_factory.mktemp("other")
    model = make_tiny_model(tmp / "model", seed=7)
    r = CliRunner().invoke(app, ["convert", str(model), "--output", str(tmp / "ckpt"), "--no-calibrate-kv", "--json"])
    assert r.exit_code == 0, r.output
    s = Server(build_engine(tmp / "ckpt", tmp), "--model-name", "model")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    from eagle_trt.convert.load_target import load_target

    model, tok, _ = load_target(tiny_model_dir)
    return model.eval(), tok


def hf_greedy(model, prompt: list[int], n: int, eos: int) -> list[int]:
    """transformers' greedy generate of one prompt alone: the target's own answer."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, temperature=None, top_p=None, top_k=None,
                             eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt):].tolist()


def prompts_of(tok, n: int) -> list[list[int]]:
    from eagle_trt.prompt_sources import prompt_ids

    return [prompt_ids(tok, f"{WORDS[i % len(WORDS)]} {i}", chat=i % 3 != 0) for i in range(n)]


def regenerator(served, target, path: Path) -> EndpointRegenerator:
    model, tok = target
    return EndpointRegenerator(served, model, tok, [tok.eos_token_id], path, {"target": "tiny"})


# ---- against the real servers -------------------------------------------------------------------------
def test_answers_are_the_targets_greedy_tokens_spread_over_both_servers(servers, target, tiny_model_dir, tmp_path):
    model, tok = target
    before = [s.finished() for s in servers]
    served = connect(EndpointOptions.parse(",".join(s.url + "/v1" for s in servers), model="tiny", concurrency=3),
                     tiny_model_dir)
    prompts = prompts_of(tok, 12)
    regen = regenerator(served, target, tmp_path / "p.jsonl")
    answers = regen(prompts + prompts[:2], 40, progress=False)  # a repeated prompt is asked once
    assert answers == [hf_greedy(model, p, 40, tok.eos_token_id) for p in prompts + prompts[:2]]
    asked = [s.finished() - b for s, b in zip(servers, before)]
    assert sum(asked) == 12 and min(asked) >= 2, asked  # each URL probed (2) and in the bulk's queue
    assert regen.stats["token_ids"] == {s.url: True for s in servers}
    assert all(p["agreement"] == 1.0 and p["tokens"] > 0 for p in regen.stats["probe"].values())
    # Asked again: every answer is read back from the progress file, none asked.
    again = regenerator(connect(served.options, tiny_model_dir), target, tmp_path / "p.jsonl")
    assert again(prompts, 40, progress=False) == answers[:12] and again.stats["asked"] == 0
    assert sum(s.finished() for s in servers) == sum(before) + 12


def test_retries_and_a_url_that_goes_down(servers, target, tiny_model_dir, tmp_path):
    model, tok = target
    prompts = prompts_of(tok, 6)
    want = [hf_greedy(model, p, 16, tok.eos_token_id) for p in prompts]
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EndpointError, match=r"cannot connect .*\(1 try\); is the server running"):
        connect(EndpointOptions.parse(f"{servers[0].url},{dead}", model="tiny", retries=0), tiny_model_dir)
    flaky = Flaky(servers[0].url, fail_first=2)  # 503 twice, then the real server's answers
    going = Flaky(servers[1].url, die_after=2)  # answers its two probe prompts, then 503 for good
    try:
        for proxy, tries in ((flaky, 3), (going, 1)):
            served = connect(EndpointOptions.parse(proxy.url if proxy is flaky else f"{going.url},{servers[0].url}",
                                                   model="tiny", concurrency=2), tiny_model_dir)
            for ep in served.endpoints:
                ep.retry = type(ep.retry)(attempts=tries, base_s=0.01)
            assert regenerator(served, target, tmp_path / f"{tries}.jsonl")(prompts, 16, progress=False) == want
        assert flaky.failed == 2 and going.answered == 2 and going.failed >= 2
    finally:
        flaky.close()
        going.close()


def test_the_server_must_serve_the_target(servers, other_server, target, tiny_model_dir, tmp_path):
    model, tok = target
    with pytest.raises(EndpointError, match=r"serves 'tiny', not the target being converted \('model'\); if it is "
                                            r"that model under another name, pass --regenerate-model 'tiny'"):
        connect(EndpointOptions.parse(servers[0].url), tiny_model_dir)
    with pytest.raises(EndpointError, match=r"serves 'tiny', not 'other'"):
        connect(EndpointOptions.parse(servers[0].url, model="other"), tiny_model_dir)
    # Named as the target, other weights: refused by the probe, and none of its answers kept.
    served = connect(EndpointOptions.parse(other_server.url), tiny_model_dir)
    path = tmp_path / "p.jsonl"
    with pytest.raises(EndpointError, match=r"its greedy answers are not the target's: \d+ of \d+ tokens .*first "
                                            r"difference at answer token \d+"):
        regenerator(served, target, path)(prompts_of(tok, 4), 24, progress=False)
    with Progress(path, {"target": "tiny", "max_new_tokens": 24}) as store:
        assert store.answers == {}


def test_token_id_prompts_and_ids_back_from_eagle_trt_serve(servers, target):
    _, tok = target
    ids = prompts_of(tok, 1)[0]

    def post(body):
        req = urllib.request.Request(servers[0].url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    code, by_ids = post({"model": "tiny", "prompt": ids, "max_tokens": 20, "temperature": 0, "return_token_ids": True})
    assert code == 200, by_ids
    text = tok.decode(ids)
    code, by_text = post({"model": "tiny", "prompt": text, "max_tokens": 20, "temperature": 0})
    choice = by_ids["choices"][0]
    assert choice["prompt_token_ids"] == ids and choice["text"] == tok.decode(choice["token_ids"],
                                                                              skip_special_tokens=True)
    assert "token_ids" not in by_text["choices"][0]
    for body, says in (({"prompt": [5, 99999]}, "outside this model's vocabulary of 260"),
                       ({"prompt": [5, -1]}, "must be >= 0"),
                       ({"prompt": [5, 6], "stream": True, "return_token_ids": True}, "without stream")):
        code, doc = post({"model": "tiny", "max_tokens": 4, **body})
        assert code == 400 and says in doc["error"]["message"], doc


def test_regenerate_answers_script_asks_the_servers(servers, target, tiny_model_dir, tmp_path):
    model, tok = target
    rows = [{"prompt": "the cat"}, {"prompt": "def f(x):", "chat": False}, {"prompt": "blue", "response": "kept"}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "answers.jsonl"
    r = subprocess.run([sys.executable, "scripts/regenerate_answers.py", str(tiny_model_dir), str(tmp_path / "in.jsonl"),
                        "--output", str(out), "--max-new-tokens", "20", "--regenerate-endpoint", servers[0].url,
                        "--regenerate-model", "tiny", "--device", "cpu"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["prompt"] for g in got] == ["the cat", "def f(x):"]  # a row with a response is not asked
    from eagle_trt.prompt_sources import prompt_ids

    for g in got:
        ans = hf_greedy(model, prompt_ids(tok, g["prompt"], chat=g.get("chat", True)), 20, tok.eos_token_id)
        ended = ans[-1] == tok.eos_token_id
        assert (g["response"], g["eos"]) == (tok.decode(ans[:-1] if ended else ans), ended)
    assert not (tmp_path / ".answers.jsonl.progress.jsonl").exists()
    bad = subprocess.run([sys.executable, "scripts/regenerate_answers.py", str(tiny_model_dir), str(tmp_path / "in.jsonl"),
                          "--output", str(out), "--regenerate-endpoint", servers[0].url], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("Error: ") and "--regenerate-model 'tiny'" in bad.stderr


# ---- convert, killed and resumed ----------------------------------------------------------------------
def _convert_args(tiny_model_dir, tmp: Path, url: str, *extra: str) -> list[str]:
    return ["convert", str(tiny_model_dir), "--output", str(tmp / "ckpt"), "--data", str(tmp / "prompts.jsonl"),
            "--steps", "2", "--batch-size", "2", "--seq-len", "128", "--no-validate", "--no-calibrate-kv",
            "--device", "cpu", "--work-dir", str(tmp / "work"), "--regenerate", "--max-new-tokens", "48",
            "--regenerate-endpoint", url, "--regenerate-model", "tiny", *extra]


def test_a_killed_convert_resumes_without_asking_twice(servers, target, tiny_model_dir, tmp_path):
    model, tok = target
    rows = [{"prompt": f"{WORDS[i % len(WORDS)]} {i}"} for i in range(30)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    progress = tmp_path / "work" / "regenerated.jsonl"
    server = servers[1]
    start = server.finished()
    args = _convert_args(tiny_model_dir, tmp_path, server.url, "--regenerate-concurrency", "1")
    proc = subprocess.Popen([sys.executable, "-m", "eagle_trt", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (progress.is_file() and progress.read_bytes().count(b"\n") >= 5):  # header + 4 answers
            assert proc.poll() is None and time.monotonic() < deadline, "convert ended before it could be killed"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    kept = [json.loads(line) for line in progress.read_text().splitlines()[1:] if line.endswith("}")]
    asked_before = server.finished() - start
    assert len(kept) <= asked_before < 26  # killed mid-way (its request in flight, if any, is not kept)

    r = CliRunner().invoke(app, _convert_args(tiny_model_dir, tmp_path, server.url, "--json"))
    assert r.exit_code == 0, r.output
    answered = [json.loads(line) for line in progress.read_text().splitlines()[1:]]
    regenerated = json.loads(r.stdout)["training"]["data"]["regeneration"]
    n = regenerated["prompts"]
    assert n == 26 and regenerated["resumed"] == len(kept)  # 30 records, 4 held out
    assert server.finished() - start - asked_before == n - len(kept)  # only the unanswered prompts were asked
    assert len(answered) == n and len({a["key"] for a in answered}) == n
    from eagle_trt.convert.data import prompt_ids, read_records

    by_key = {prompt_key(p): p for p in (prompt_ids(rec, tok, 128) for rec in read_records([tmp_path / "prompts.jsonl"]))}
    for a in answered:
        assert a["answer"] == hf_greedy(model, by_key[a["key"]], 48, tok.eos_token_id)


def test_convert_refuses_bad_endpoint_options_before_loading(tiny_model_dir, tmp_path):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    dead = f"http://127.0.0.1:{free_port()}"
    for extra, says in (([dead, "--regenerate-retries", "0"], f"{dead}/v1/models: cannot connect"),
                        (["ftp://127.0.0.1:1"], "give http://HOST:PORT"),
                        ([f"{dead},{dead}/v1/"], "names a URL twice"),
                        ([dead, "--regenerate-concurrency", "0"], "--regenerate-concurrency must be in [1, 1024]")):
        args = _convert_args(tiny_model_dir, tmp_path, *extra)
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output
    r = CliRunner().invoke(app, ["convert", str(tiny_model_dir), "--output", str(tmp_path / "c"),
                                 "--regenerate-endpoint", dead])
    assert r.exit_code == 2 and "add --regenerate and --steps N or --epochs N" in r.output, r.output


# ---- the pieces ----------------------------------------------------------------------------------------
def test_probe_scores_every_position_under_the_target(target):
    model, tok = target
    prompt = prompts_of(tok, 1)[0]
    answer = hf_greedy(model, prompt, 24, tok.eos_token_id)
    assert teacher_forced(model, prompt, answer)[:2] == (len(answer), len(answer))
    wrong = answer[:5] + [(answer[5] + 1) % 256] + answer[6:]  # one token changed: one position misses
    matched, compared, first = teacher_forced(model, prompt, wrong)
    assert (compared, first.position, first.served, first.target) == (len(answer), 5, wrong[5], answer[5])
    assert 5 <= matched < len(answer)  # every position before it still agrees


def test_progress_survives_a_cut_line_and_belongs_to_one_run(tmp_path):
    path = tmp_path / "p.jsonl"
    with Progress(path, {"target": ["a", 1]}) as p:
        p.append("k1", [1, 2])
        p.append("k2", [3])
    path.write_bytes(path.read_bytes() + b'{"key":"k3","ans')  # a kill in the middle of a write
    with Progress(path, {"target": ["a", 1]}) as p:
        assert p.answers == {"k1": [1, 2], "k2": [3]}
        with pytest.raises(Exception, match="in use by another convert"), Progress(path, {"target": ["a", 1]}):
            pass
        p.append("k3", [4])
    assert path.read_text().count("\n") == 4 and path.read_text().endswith('"answer":[4]}\n')
    with Progress(path, {"target": ["b", 1]}) as p:  # another target's answers are not reused
        assert p.answers == {}
    assert path.read_text().count("\n") == 1


@pytest.mark.parametrize("url, want", [("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
                                       ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
                                       ("https://h.example/api/v1", "https://h.example/api")])
def test_base_urls(url, want):
    assert base_url(url) == want


@pytest.mark.parametrize("url, says", [("ftp://h:1", "give http://HOST:PORT"), ("http://:80", "give http://HOST"),
                                       ("http://u:secret@h:80", "no user or password"),
                                       ("http://h:99999", "port is not a number"), ("http://h/?x=1", "no query")])
def test_bad_base_urls(url, says):
    with pytest.raises(EndpointError, match=says) as e:
        base_url(url)
    assert "secret" not in str(e.value)
