"""`eagle-trt serve`: the engine behind an OpenAI-compatible HTTP API (eagle_trt/serve/)."""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle_trt.cli.common import EngineOpt, SkipVerifyOpt, ThreadsOpt, apply_threads, err_console, handle_errors, \
    require_engine
from eagle_trt.errors import InputError, MissingDependencyError
from eagle_trt.safetensors_stream import parse_size


def serve(
    engine: EngineOpt,
    host: Annotated[str, typer.Option(help="Address to bind. 127.0.0.1 (this machine only) unless you mean "
                                      "otherwise; any other address needs --api-key (or --allow-unauthenticated).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0 picks a free one and prints it).")] = 8000,
    max_batch: Annotated[int, typer.Option(
        help="Requests decoded together: each engine step is one target forward over all of them.")] = 8,
    max_queue: Annotated[int, typer.Option(help="Requests that may wait; one more is answered 429.")] = 64,
    kv_cache_memory: Annotated[Optional[str], typer.Option(
        help="KV cache the running requests may reserve in all (e.g. 2GiB, 500MB); a request that does not fit "
             "waits, one larger than all of it is a 400. Default: --max-batch requests of any size.")] = None,
    no_batch_sizing: Annotated[bool, typer.Option(
        "--no-batch-sizing", help="Every request drafts its configured tree, whatever the batch.")]
    = False,
    api_key: Annotated[Optional[str], typer.Option(
        envvar="EAGLE_TRT_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1/* (also EAGLE_TRT_API_KEY); "
        "/health and /metrics stay open, as vLLM's do.")] = None,
    allow_unauthenticated: Annotated[bool, typer.Option(
        "--allow-unauthenticated", help="Serve an address other than loopback without --api-key (behind a proxy "
        "that checks clients itself).")] = False,
    model_name: Annotated[Optional[str], typer.Option(
        "--model-name", help="The model id clients ask for (default: the engine's name).")] = None,
    drain_seconds: Annotated[float, typer.Option(
        help="On SIGTERM/SIGINT: refuse new requests and give running ones this long to finish.")] = 30.0,
    skip_verify: SkipVerifyOpt = False,
    threads: ThreadsOpt = None,
) -> None:
    """Serve an engine over the OpenAI API: POST /v1/chat/completions and /v1/completions (streaming with
    "stream": true), GET /v1/models, /health and /metrics (Prometheus). A TensorRT-LLM bundle is served by its own
    serve.sh (trtllm-serve) with the same --host and --port.

    Concurrent requests are batched continuously: every engine step is one target forward over every running
    request's rows. The server measures whether drafting beats plain decoding at the batch's width (where it does
    not, the batch runs as batched plain decoding) and cuts each tree to the nodes worth their rows. Each answer is what `eagle-trt run` gives for
    its prompt alone (greedy output equals `--mode ar`). Example:

        eagle-trt serve --engine engines/smollm2-135m-eagle3 --port 8000

        curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
             -d '{"model": "smollm2-135m-eagle3", "messages": [{"role": "user", "content": "Hi"}]}'
    """
    handle_errors(_serve)(engine, host, port, max_queue, api_key, model_name, drain_seconds, skip_verify, threads,
                          max_batch, kv_cache_memory, not no_batch_sizing, allow_unauthenticated)


# How a bundle's server is protected: trtllm-serve checks no key of eagle-trt's.
BUNDLE_PROTECTION = ("serve the bundle on 127.0.0.1 (the default) behind a reverse proxy that checks clients (an API "
                     "key or TLS client certificates), and open only the proxy to the network")


def is_loopback(host: str) -> bool:
    """Whether binding host keeps the server to this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def check_exposure(host: str, api_key: str | None, allow_unauthenticated: bool) -> None:
    """An address other than loopback without a key is refused unless the user says it is meant."""
    if api_key is None and not allow_unauthenticated and not is_loopback(host):
        raise InputError(f"--host {host} is reachable from other machines: give --api-key KEY (or "
                         "EAGLE_TRT_API_KEY), or --allow-unauthenticated if a proxy in front checks clients")


def _exec_bundle_serve(root: Path, host: str, port: int, api_key: str | None, allow_unauthenticated: bool) -> None:
    """A TensorRT-LLM bundle serves with trtllm-serve through its own serve.sh: this process becomes that one."""
    script = root / "serve.sh"
    if not script.is_file():
        raise InputError(f"'{root}' is a TensorRT-LLM bundle without serve.sh; rebuild it with `eagle-trt build`")
    if api_key is not None:
        raise InputError(f"--api-key: trtllm-serve checks no API key of eagle-trt's; {BUNDLE_PROTECTION}")
    if not allow_unauthenticated and not is_loopback(host):
        raise InputError(f"--host {host}: trtllm-serve checks no API key; {BUNDLE_PROTECTION} (or pass "
                         "--allow-unauthenticated)")
    if port == 0:
        raise InputError("--port 0: trtllm-serve needs a fixed port")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp("bash", ["bash", str(script), "--host", host, "--port", str(port)])


def _draining_server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, but a SIGTERM/SIGINT that drained in time exits 0 (uvicorn re-raises the signal after
        its graceful shutdown, which makes the exit status 143/130)."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    return DrainingServer


def _serve(engine, host, port, max_queue, api_key, model_name, drain_seconds, skip_verify, threads, max_batch=8,
           kv_cache_memory=None, size_trees=True, allow_unauthenticated=False) -> None:
    # Imported here: the server stack and the session pull in torch, FastAPI and uvicorn, which the other commands
    # should not wait for; FastAPI, uvicorn and prometheus-client are the optional `serve` extra.
    try:
        import uvicorn  # noqa: F401 - imported by _run; checked here, before the engine is opened

        from eagle_trt.serve.app import make_app
        from eagle_trt.serve.worker import EngineWorker
    except ImportError as e:
        raise MissingDependencyError(f"eagle-trt serve needs FastAPI, uvicorn and prometheus-client ({e})",
                                     hint="pip install 'eagle-trt[serve]'") from None
    from eagle_trt.engine.engine_dir import open_engine
    from eagle_trt.models import huge_pages
    from eagle_trt.runtime.session import Session

    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {port}")
    require_engine(engine)
    if open_engine(engine, verify=False).config.backend != "torch":  # the manifest says; the bundle is verified next
        _exec_bundle_serve(Path(open_engine(engine, verify=not skip_verify).root), host, port, api_key,
                           allow_unauthenticated)
    check_exposure(host, api_key, allow_unauthenticated)
    if max_queue < 1:
        raise InputError(f"--max-queue must be >= 1, got {max_queue}")
    if drain_seconds < 0:
        raise InputError(f"--drain-seconds must be >= 0, got {drain_seconds}")
    if not 1 <= max_batch <= 256:
        raise InputError(f"--max-batch must be in [1, 256], got {max_batch}")
    kv_budget = None
    if kv_cache_memory is not None:
        try:
            kv_budget = parse_size(kv_cache_memory)
        except ValueError as e:
            raise InputError(f"--kv-cache-memory: {e}") from None

    def open_session() -> Session:
        apply_threads(threads)
        huge_pages.prefer()  # a server decodes for long: weights in huge pages (models/huge_pages.py)
        return Session.open(engine, verify=not skip_verify)

    worker = EngineWorker(open_session, max_queue=max_queue, max_batch=max_batch, kv_budget_bytes=kv_budget,
                          size_trees=size_trees)
    session = worker.start_and_wait()  # the engine thread opens it: only that thread runs the model
    name = model_name or session.config.name
    if not is_loopback(host):
        err_console.print(f"Warning: binding {host}: reachable from other machines"
                          + ("" if api_key else " with no --api-key"), markup=False)
    _run(make_app(session, worker, name, api_key), worker, name, host, port, drain_seconds, max_queue)


def _run(app, worker, name: str, host: str, port: int, drain_seconds: float, max_queue: int) -> None:
    """uvicorn on the app until SIGTERM/SIGINT, then the drain: the engine takes no new request (503, and /health
    says draining), a request still sending its body is answered 503, idle connections are closed, and the running
    answers get drain_seconds to finish."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=int(drain_seconds), limit_concurrency=max_queue + 16)
    server = _draining_server_class()(config)
    _announce, _shutdown = server.startup, server.shutdown

    async def startup(sockets=None):
        await _announce(sockets)
        bound = [s.getsockname() for srv in server.servers for s in srv.sockets]
        where = ", ".join(f"http://{a[0]}:{a[1]}" for a in bound)
        err_console.print(f"serving '{name}' on {where} (Ctrl-C to stop)", markup=False)

    async def shutdown(sockets=None):
        worker.stop()
        app.state.draining.set()
        await _shutdown(sockets)

    server.startup, server.shutdown = startup, shutdown
    try:
        server.run()
    finally:
        worker.stop()
        worker.join(timeout=drain_seconds)
