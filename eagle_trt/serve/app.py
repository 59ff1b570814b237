"""The HTTP side: OpenAI's chat completions and completions (streamed as server-sent events, or whole), models,
health and Prometheus metrics, on FastAPI. The engine runs in its own thread (worker.py); handlers only wait.

    app = make_app(session, worker, name="tiny", api_key=None)
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from eagle_trt.errors import EagleError
from eagle_trt.prompt_sources import prompt_ids
from eagle_trt.runtime.session import Session
from eagle_trt.serve.wire import ApiError, ChatRequest, CompletionRequest, usage
from eagle_trt.serve.worker import EngineWorker, Finished

MAX_BODY = 4 * 2**20  # bytes a request body may have


def make_app(session: Session, worker: EngineWorker, name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="eagle-trt", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())
    _guard(app, api_key)
    _errors(app)

    @app.get("/health")
    async def health():
        if worker.stopping.is_set():
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(worker.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                            "owned_by": "eagle-trt"}]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        encode = lambda: prompt_ids(session.tokenizer, messages, chat=True)  # noqa: E731
        return await _complete(session, worker, name, body, encode, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        encode = lambda: _token_prompt(session, body.prompt) if isinstance(body.prompt, list) else prompt_ids(  # noqa: E731
            session.tokenizer, body.prompt, chat=False)
        return await _complete(session, worker, name, body, encode, chat=False)

    return app


def _guard(app: FastAPI, api_key: str | None) -> None:
    """/v1/*: the API key (when the server has one) and the body size, before anything is parsed."""

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.url.path.startswith("/v1/"):
            if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
                return _error(ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                                       kind="authentication_error"))
            length = request.headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
                return _error(ApiError(413, f"the request body is larger than {MAX_BODY} bytes"))
        return await call_next(request)


def _errors(app: FastAPI) -> None:
    """Every error in OpenAI's shape: ours, the request model's validation, and the framework's (404, 405, ...)."""

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
        return _error(e)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request", "type": ""}
        if first.get("type") == "json_invalid":
            return _error(ApiError(400, "the request body is not valid JSON"))
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        msg = first["msg"].removeprefix("Value error, ")
        return _error(ApiError(400, f"{'.'.join(loc) + ': ' if loc else ''}{msg}", ".".join(loc) or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, e: StarletteHTTPException):
        return _error(ApiError(e.status_code, str(e.detail)))


async def _complete(session: Session, worker: EngineWorker, name: str, body, encode, chat: bool):
    """One completion request: checked, queued, then streamed back or collected whole."""
    if body.model not in (None, name):
        raise ApiError(404, f"the model '{body.model}' does not exist; this server serves '{name}'", "model",
                       code="model_not_found")
    ids, config = _prepare(session, worker, body, encode)
    job = worker.submit(ids, config, body.stops, asyncio.get_running_loop())
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    head = {"id": rid, "created": int(time.time()), "model": name}
    if body.stream:
        return StreamingResponse(_stream(job, head, chat, body.include_usage), media_type="text/event-stream")
    text, done = [], None
    try:
        async for kind, value in job.events():
            if kind == "text":
                text.append(value)
            elif kind == "error":
                raise value
            else:
                done = value
    finally:
        job.cancel()  # a no-op once done; frees the engine when the client went away
    content = "".join(text)
    choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if chat
              else {"index": 0, "text": content, "logprobs": None})
    choice["finish_reason"] = done.finish_reason
    if body.return_token_ids:
        choice.update(prompt_token_ids=list(ids), token_ids=list(done.token_ids))
    return {**head, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
            "usage": usage(done.prompt_tokens, done.completion_tokens), "eagle_trt": _extension(done)}


def _token_prompt(session: Session, ids: list[int]) -> list[int]:
    """A prompt given as token ids, each checked against the engine's vocabulary."""
    vocab = session.runner.target.spec.vocab_size
    bad = next((t for t in ids if t >= vocab), None)
    if bad is not None:
        raise ApiError(400, f"prompt token id {bad} is outside this model's vocabulary of {vocab}", "prompt")
    return list(ids)


def _prepare(session: Session, worker: EngineWorker, body, encode):
    """The request's ids and decode settings, checked against the engine (and the KV budget) before anything is
    queued."""
    try:
        ids = encode()
        cfg = session.config
        limit = body.limit if body.limit is not None else cfg.max_output_len
        if limit > cfg.max_output_len:
            raise ApiError(400, f"max_tokens {limit} exceeds this engine's max_output_len {cfg.max_output_len}",
                           "max_tokens")
        config = session.decode_config(max_new_tokens=limit, temperature=body.temperature, top_p=body.top_p,
                                       top_k=body.top_k, seed=body.seed, mode=body.mode)
        worker.check(ids, config)
    except EagleError as e:
        raise ApiError(400, str(e)) from None
    return ids, config


async def _stream(job, head: dict, chat: bool, include_usage: bool):
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta_or_text, finish=None, **extra) -> str:
        choice = ({"index": 0, "delta": delta_or_text} if chat else {"index": 0, "text": delta_or_text,
                                                                      "logprobs": None})
        choice["finish_reason"] = finish
        return "data: " + json.dumps({**head, "object": obj, "choices": [choice], **extra}) + "\n\n"

    try:
        if chat:
            yield chunk({"role": "assistant", "content": ""})
        async for kind, value in job.events():
            if kind == "text":
                yield chunk({"content": value} if chat else value)
            elif kind == "error":
                yield "data: " + json.dumps(value.body()) + "\n\n"
                break
            else:
                done: Finished = value
                yield chunk({} if chat else "", done.finish_reason, eagle_trt=_extension(done))
                if include_usage:
                    yield "data: " + json.dumps({**head, "object": obj, "choices": [],
                                                 "usage": usage(done.prompt_tokens, done.completion_tokens)}) + "\n\n"
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # the client disconnected (or the stream ended): the engine moves on within one step


def _extension(done: Finished) -> dict:
    """What OpenAI's shape has no field for: how the speculation went for this request."""
    m = done.metrics
    return {"mode": m.get("mode"), "acceptance_length": m.get("acceptance_length"),
            "verify_steps": m.get("verify_steps"), "accepted_draft_tokens": done.accepted_draft_tokens}


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)
