"""`eagle-trt bench-serve`: a closed-loop load on an OpenAI-compatible server on this machine, plain decoding and
speculative decoding side by side at each concurrency.

    results = serve_load(url, prompts, concurrency=[1, 2, 4], max_tokens=128, requests=8)

At each concurrency c, c clients each send their next request as soon as their last one finished, until `requests`
requests are done; every request streams (`"stream": true`), so the time to its first text (TTFT) and between its
tokens (TPOT) are measured where the client sees them. Each prompt is sent with `"mode": "ar"` (eagle-trt's plain
decoding) and `"mode": "eagle"`, and every speculative answer is checked against the plain one (greedy: they must
be equal). Only loopback addresses are ever a target.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from eagle_trt import timing
from eagle_trt.errors import InputError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
REQUEST_TIMEOUT = 600.0  # seconds one request may take before the run is abandoned
MODES = ("ar", "eagle")


@dataclass
class Sample:
    prompt: int
    text: str
    ttft_s: float
    total_s: float
    tokens: int
    tau: float | None


@dataclass
class Level:
    mode: str
    concurrency: int
    wall_s: float
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> dict:
        tokens = sum(s.tokens for s in self.samples)
        tpot = [(s.total_s - s.ttft_s) / (s.tokens - 1) for s in self.samples if s.tokens > 1]
        taus = [s.tau for s in self.samples if s.tau is not None]
        return {"mode": self.mode, "concurrency": self.concurrency, "requests": len(self.samples),
                "output_tokens": tokens, "output_tokens_per_s": round(tokens / self.wall_s, 3) if self.wall_s else 0,
                "ttft_ms": _pcts([s.ttft_s * 1e3 for s in self.samples]), "tpot_ms": _pcts([t * 1e3 for t in tpot]),
                "acceptance_length": round(statistics.fmean(taus), 4) if taus else None}


def check_loopback(url: str) -> tuple[str, int]:
    """(host, port) of an http:// URL on this machine; anything else is refused."""
    u = urlparse(url)
    if u.scheme != "http" or u.hostname not in LOOPBACK or not u.port:
        raise InputError(f"--url must be http://127.0.0.1:PORT (this machine), got {url!r}")
    return u.hostname, u.port


def one_request(host: str, port: int, model: str, messages: list[dict], max_tokens: int, mode: str,
                api_key: str | None = None) -> tuple[str, float, float, int, float | None]:
    """Stream one chat completion: (text, seconds to the first text, seconds in all, completion tokens, tau)."""
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True, "mode": mode,
                       "stream_options": {"include_usage": True}, "temperature": 0})
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT)
    start = timing.now()
    first, parts, tokens, tau = None, [], 0, None
    try:
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise InputError(f"the server answered {resp.status}: {resp.read()[:300]!r}")
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise InputError(f"the server failed a request: {event['error'].get('message')}")
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content") or ""
                if piece:
                    first = first or timing.now()
                    parts.append(piece)
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if event.get("eagle_trt"):
                tau = event["eagle_trt"].get("acceptance_length") if mode == "eagle" else None
    finally:
        conn.close()
    end = timing.now()
    return "".join(parts), (first or end) - start, end - start, tokens, tau


def run_level(host: str, port: int, model: str, prompts: list[list[dict]], mode: str, concurrency: int,
              requests: int, max_tokens: int, api_key: str | None = None) -> Level:
    """`requests` requests (prompts in turn) from `concurrency` closed-loop clients."""
    todo = list(range(requests))
    lock, errors = threading.Lock(), []
    level = Level(mode, concurrency, 0.0)

    def client() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop(0)
            try:
                text, ttft, total, tokens, tau = one_request(host, port, model, prompts[i % len(prompts)],
                                                             max_tokens, mode, api_key)
            except Exception as e:  # noqa: BLE001 - reported once, after the clients stop
                with lock:
                    errors.append(e)
                return
            with lock:
                level.samples.append(Sample(i % len(prompts), text, ttft, total, tokens, tau))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    start = timing.now()
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT * requests)
    level.wall_s = timing.now() - start
    if errors:
        e = errors[0]
        raise e if isinstance(e, InputError) else InputError(f"a request failed: {type(e).__name__}: {e}")
    return level


def serve_load(url: str, model: str, prompts: list[list[dict]], concurrency: list[int], max_tokens: int,
               requests: int, api_key: str | None = None, progress=None, repeats: int = 1) -> dict:
    """Both modes at every concurrency, `repeats` times each, the modes alternating (ar, eagle, ar, eagle, ...) so
    that a machine's drift hits both alike. Returns {"levels": [summary, ...], "mismatches": [...]}: one summary
    per concurrency and mode (throughput median and min over the repeats, latencies over every request of them), and
    the prompts whose speculative answer differs from their plain one."""
    host, port = check_loopback(url)
    levels, answers = [], {}
    for c in concurrency:
        runs: dict[str, list[Level]] = {m: [] for m in MODES}
        for r in range(repeats):
            for mode in MODES:
                if progress:
                    progress(f"{mode} at concurrency {c}: {requests} requests" + (
                        f" (repeat {r + 1}/{repeats})" if repeats > 1 else ""))
                level = run_level(host, port, model, prompts, mode, c, requests, max_tokens, api_key)
                runs[mode].append(level)
                for smp in level.samples:
                    answers.setdefault((mode, smp.prompt), set()).add(smp.text)
        levels += [merged(runs[mode]) for mode in MODES]
    mismatches = sorted({p for (mode, p), texts in answers.items() if mode == "eagle"
                         and texts != answers.get(("ar", p), texts)})
    return {"levels": levels, "mismatches": mismatches, "repeats": repeats}


def merged(runs: list[Level]) -> dict:
    """One summary of a level's repeats: latencies over all their requests; throughput per repeat (median, min)."""
    whole = Level(runs[0].mode, runs[0].concurrency, sum(r.wall_s for r in runs),
                  [smp for r in runs for smp in r.samples])
    out = whole.summary()
    per_run = [r.summary()["output_tokens_per_s"] for r in runs]
    out.update(output_tokens_per_s=round(statistics.median(per_run), 3), output_tokens_per_s_min=min(per_run),
               output_tokens_per_s_runs=per_run)
    return out


def ratios(levels: list[dict]) -> dict:
    """Speculative over plain throughput at each concurrency, and each mode's throughput over concurrency-1 plain
    decoding (what batching buys)."""
    by = {(lv["concurrency"], lv["mode"]): lv["output_tokens_per_s"] for lv in levels}
    base = by.get((min(c for c, _ in by), "ar")) if by else None
    out = {}
    for c in sorted({c for c, _ in by}):
        ar, eagle = by.get((c, "ar")), by.get((c, "eagle"))
        out[str(c)] = {"eagle_over_ar": round(eagle / ar, 3) if ar and eagle else None,
                       "ar_over_c1_ar": round(ar / base, 3) if ar and base else None,
                       "eagle_over_c1_ar": round(eagle / base, 3) if eagle and base else None}
    return out


class LocalServer:
    """`eagle-trt serve` on a free port of 127.0.0.1, for the length of a `with` block."""

    def __init__(self, engine: Path, extra: list[str] = ()):
        self.cmd = [sys.executable, "-m", "eagle_trt", "serve", "--engine", str(engine), "--host", "127.0.0.1",
                    "--port", "0", *extra]

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ})
        deadline = time.monotonic() + 300
        line = ""
        while "serving" not in line:
            line = self.proc.stderr.readline()
            if (not line and self.proc.poll() is not None) or time.monotonic() > deadline:
                self.__exit__()
                raise InputError(f"eagle-trt serve did not start: {line.strip()}")
        return line.split(" on ")[1].split()[0]

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def report_markdown(results: dict) -> str:
    reps = results.get("repeats", 1)
    lines = [f"# bench-serve: {results['model']}", "", f"CPU: {results.get('cpu', '?')}; max_tokens "
             f"{results['max_tokens']}, {results['requests']} requests per level and mode, {reps} repeat(s), the "
             f"modes alternating; command: `{results['command']}`", "",
             "| concurrency | mode | output tok/s (median / min) | TTFT p50 / p99 ms | TPOT p50 / p99 ms | τ |",
             "|---|---|---|---|---|---|"]
    for lv in results["levels"]:
        lines.append(f"| {lv['concurrency']} | {lv['mode']} | {lv['output_tokens_per_s']:.2f} / "
                     f"{lv.get('output_tokens_per_s_min', lv['output_tokens_per_s']):.2f} | "
                     f"{lv['ttft_ms']['p50']:.0f} / {lv['ttft_ms']['p99']:.0f} | "
                     f"{lv['tpot_ms']['p50']:.1f} / {lv['tpot_ms']['p99']:.1f} | "
                     f"{lv['acceptance_length'] if lv['acceptance_length'] is not None else '-'} |")
    lines += ["", "| concurrency | speculative / plain | plain / plain at c=1 | speculative / plain at c=1 |",
              "|---|---|---|---|"]
    for c, r in results.get("ratios", {}).items():
        lines.append(f"| {c} | {r['eagle_over_ar']} | {r['ar_over_c1_ar']} | {r['eagle_over_c1_ar']} |")
    lines += ["", "Speculative answers equal to plain ones: " + ("all" if not results["mismatches"] else
                                                                   f"NOT for prompts {results['mismatches']}")]
    return "\n".join(lines) + "\n"


def write_plot(results: dict, out: Path) -> Path | None:
    """throughput_latency.png: output tok/s against TPOT p50 per mode, one point per concurrency (None without
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in MODES:
        pts = [(lv["tpot_ms"]["p50"], lv["output_tokens_per_s"], lv["concurrency"]) for lv in results["levels"]
               if lv["mode"] == mode]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label={"ar": "plain", "eagle": "speculative"}[mode])
        for x, y, c in pts:
            ax.annotate(f"c={c}", (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.set_xlabel("time per output token, p50 (ms)")
    ax.set_ylabel("output tokens/s (all requests)")
    ax.set_title(f"Throughput vs latency, {results['model']}")
    ax.legend()
    fig.tight_layout()
    path = out / "throughput_latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pcts(values: list[float]) -> dict:
    if not values:
        return {"p50": 0.0, "p99": 0.0}
    v = sorted(values)
    return {"p50": round(statistics.median(v), 3), "p99": round(v[min(len(v) - 1, int(0.99 * len(v)))], 3)}
