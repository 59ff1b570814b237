"""`eagle-trt bench-serve`: load an OpenAI-compatible server on this machine, plain vs speculative decoding."""

from __future__ import annotations

import json
import platform
import sys
import urllib.request
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from eagle_trt.cli.common import JsonOpt, console, err_console, handle_errors, print_json
from eagle_trt.errors import InputError


def bench_serve(
    engine: Annotated[Optional[Path], typer.Option("--engine", "-e", help="Start `eagle-trt serve` on this engine "
                                                   "(127.0.0.1, a free port) for the run.")] = None,
    url: Annotated[Optional[str], typer.Option(help="Or load a server already running on this machine "
                                               "(http://127.0.0.1:PORT); it must take eagle-trt's \"mode\" field.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model id to ask for (default: the server's first).")] = None,
    prompts: Annotated[str, typer.Option(help="chat, humaneval or a .jsonl file (as `bench`).")] = "chat",
    limit: Annotated[Optional[int], typer.Option(help="First N prompts of the set.")] = 8,
    concurrency: Annotated[str, typer.Option(help="Concurrency levels, comma-separated.")] = "1,2,4,8,16",
    repeats: Annotated[int, typer.Option(help="Runs of each level and mode, the modes alternating; throughput is "
                                         "reported as median and min over them.")] = 2,
    requests: Annotated[Optional[int], typer.Option(help="Requests per level and mode (default: 2 x the highest "
                                                    "concurrency, at least 4).")] = None,
    max_tokens: Annotated[int, typer.Option(help="max_tokens of every request.")] = 64,
    api_key: Annotated[Optional[str], typer.Option(envvar="EAGLE_TRT_API_KEY", help="Bearer key, if the server "
                                                   "needs one.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Folder for results.json and report.md.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Closed-loop load at each concurrency, plain (`"mode": "ar"`) and speculative decoding side by side: output
    tokens/s, TTFT and TPOT p50/p99, tau, and every speculative answer checked against the plain one.

    Example: eagle-trt bench-serve --engine engines/smollm2-135m-eagle3 --concurrency 1,2,4 --out bench-serve
    """
    handle_errors(_bench_serve)(engine, url, model, prompts, limit, concurrency, requests, max_tokens, api_key, out,
                                json_out, repeats)


def _bench_serve(engine, url, model, prompts, limit, concurrency, requests, max_tokens, api_key, out, json_out,
                 repeats=1):
    # Imported here: the bench modules pull in torch, which `eagle-trt --help` should not wait for.
    from eagle_trt.bench.prompts import load_prompts
    from eagle_trt.bench.report import prepare_out
    from eagle_trt.bench.serve_load import LocalServer, check_loopback, ratios, report_markdown, write_plot

    if (engine is None) == (url is None):
        raise InputError("give --engine (a server is started for the run) or --url (one already running), not both")
    try:
        levels = sorted({int(c) for c in concurrency.split(",") if c.strip()})
    except ValueError:
        raise InputError(f"--concurrency must list integers, got {concurrency!r}") from None
    if not levels or levels[0] < 1 or levels[-1] > 256:
        raise InputError(f"--concurrency must list integers in [1, 256], got {concurrency!r}")
    requests = requests if requests is not None else max(4, 2 * levels[-1])
    if requests < 1 or max_tokens < 1 or repeats < 1:
        raise InputError("--requests, --max-tokens and --repeats must be >= 1")
    if url is not None:
        check_loopback(url)
    chats = [p.messages or [{"role": "user", "content": p.text}] for p in load_prompts(prompts, limit)]
    out = prepare_out(out) if out is not None else None
    progress = None if json_out else (lambda msg: err_console.print(msg, markup=False))
    if engine is not None:
        with LocalServer(engine, ["--api-key", api_key] if api_key else []) as started:
            results = _run(started, model, chats, levels, max_tokens, requests, api_key, progress, repeats)
    else:
        results = _run(url, model, chats, levels, max_tokens, requests, api_key, progress, repeats)
    results["ratios"] = ratios(results["levels"])
    results.update(cpu=cpu_name(), max_tokens=max_tokens, requests=requests, prompts=prompts,
                   command=" ".join(["eagle-trt", "bench-serve", *sys.argv[2:]]))
    if out is not None:
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        (out / "report.md").write_text(report_markdown(results), encoding="utf-8")
        write_plot(results, out)
    if json_out:
        print_json(results)
    else:
        console.print(_table(results))
    if results["mismatches"]:
        raise InputError(f"speculative answers differ from plain decoding for prompts {results['mismatches']}")


def _run(url, model, chats, levels, max_tokens, requests, api_key, progress, repeats) -> dict:
    from eagle_trt.bench.serve_load import serve_load  # (torch, as above)

    model = model or _first_model(url, api_key)
    results = serve_load(url, model, chats, levels, max_tokens, requests, api_key, progress, repeats)
    results["model"] = model
    return results


def _first_model(url: str, api_key: str | None) -> str:
    req = urllib.request.Request(url.rstrip("/") + "/v1/models",
                                 headers={"authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise InputError(f"{url}/v1/models did not list a model ({e}); pass --model") from None


def cpu_name() -> str:
    """The CPU's model name (what a benchmark or stress run names beside its numbers)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _table(results: dict) -> Table:
    t = Table(title=f"bench-serve {results['model']} ({results['cpu']})", title_justify="left")
    for col in ("concurrency", "mode", "output tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "τ"):
        t.add_column(col, justify="right")
    for lv in results["levels"]:
        t.add_row(str(lv["concurrency"]), lv["mode"], f"{lv['output_tokens_per_s']:.2f}",
                  f"{lv['ttft_ms']['p50']:.0f}/{lv['ttft_ms']['p99']:.0f}",
                  f"{lv['tpot_ms']['p50']:.1f}/{lv['tpot_ms']['p99']:.1f}",
                  "-" if lv["acceptance_length"] is None else f"{lv['acceptance_length']:.2f}")
    return t
