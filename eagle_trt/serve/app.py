"""The HTTP side: OpenAI's chat completions and completions (streamed as server-sent events, or whole), models,
health and Prometheus metrics, on FastAPI. The engine runs in its own thread (worker.py); handlers only wait.

    app = make_app(session, worker, name="tiny", api_key=None)
    uvicorn.run(app, host="127.0.0.1", port=8000)
    app.state.draining.set()   # on SIGTERM: requests still sending their body are answered 503

The event loop only moves bytes: the body is bounded as it arrives (guard.py), and parsing, validating, chat
templating and tokenizing run in worker threads, after the prompt's length is checked against the longest text
max_input_len tokens can spell, so no request holds up /health or the streams of others.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from functools import partial

import jinja2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from eagle_trt.errors import EagleError
from eagle_trt.prompt_sources import prompt_ids
from eagle_trt.runtime.session import Session
from eagle_trt.serve.guard import Guard
from eagle_trt.serve.wire import UNION_RULES, ApiError, ChatRequest, CompletionRequest, usage
from eagle_trt.serve.worker import EngineWorker, Finished

MAX_BODY = 4 * 2**20  # bytes a request body may have
NORMALIZER_SLACK = 4
CLIENT_GONE = 499  # the status logged for a request whose client left before its answer (nginx's; never sent)


def make_app(session: Session, worker: EngineWorker, name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="eagle-trt", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())
    app.state.draining = asyncio.Event()
    app.add_middleware(Guard, api_key=api_key, max_body=MAX_BODY, draining=app.state.draining)
    _errors(app)
    max_chars = max_prompt_chars(session)

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
    async def chat(request: Request):
        body = await _parse(request, ChatRequest)
        _bound(body, session, max_chars, "messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        encode = partial(prompt_ids, session.tokenizer, messages, chat=True)
        return await _complete(request, session, worker, name, body, encode, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(request, CompletionRequest)
        _bound(body, session, max_chars, "prompt")
        encode = (partial(_token_prompt, session, body.prompt) if isinstance(body.prompt, list)
                  else partial(prompt_ids, session.tokenizer, body.prompt, chat=False))
        return await _complete(request, session, worker, name, body, encode, chat=False)

    return app


def max_prompt_chars(session: Session) -> int:
    """The longest prompt text that can be max_input_len tokens: no token spells more characters than the longest
    entry of the vocabulary (byte-level entries spell one byte a character), so a longer text is too long for the
    engine before it is tokenized. Times NORMALIZER_SLACK: a normalizer (NFC, NFKC) may compose several characters
    into one before the tokenizer sees them."""
    longest = max(map(len, session.tokenizer.get_vocab()), default=1)
    return max(longest, 1) * session.config.max_input_len * NORMALIZER_SLACK


def _bound(body, session: Session, max_chars: int, param: str) -> None:
    """A prompt longer than any max_input_len tokens can spell, or of more token ids than that, is a 400 before it
    is templated or tokenized."""
    max_input_len = session.config.max_input_len
    ids = isinstance(getattr(body, "prompt", None), list)
    limit, unit = (max_input_len, "token ids") if ids else (max_chars, "characters")
    if body.text_length > limit:
        raise ApiError(400, f"the prompt has {body.text_length} {unit}, more than this engine's max_input_len of "
                            f"{max_input_len} tokens can hold", param)


async def _parse(request: Request, model):
    """The body as the request model, parsed and validated off the event loop; a 400 naming the first problem."""
    raw = await request.body()
    try:
        return await asyncio.to_thread(model.model_validate_json, raw)
    except ValidationError as e:
        raise ApiError(400, *_validation_message(e.errors(include_url=False, include_input=False))) from None


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """(message, param) for the first of pydantic's errors: `field.path: what is wrong`. A union's member tags
    ('str', 'list[int]') are left out of the path; a type error inside a union says what the field may be."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        why = first.get("ctx", {}).get("error")
        return "the request body is not valid JSON" + (f" ({why})" if why else ""), None
    if first.get("type") == "model_type":
        return "the request body must be a JSON object", None
    loc = first.get("loc", ())
    path = [str(x) for x in loc if x != "body" and (isinstance(x, int) or (x.isidentifier() and x not in TAGS))]
    msg = first["msg"].removeprefix("Value error, ")
    named = [x for x in path if not x.isdigit()]
    if len(path) < len(loc) and named and named[-1] in UNION_RULES and first.get("type", "").endswith("_type"):
        msg = UNION_RULES[named[-1]]
    param = ".".join(path) or None
    return f"{param + ': ' if param else ''}{msg}", param


TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}  # how pydantic names a union's members in a loc


def _errors(app: FastAPI) -> None:
    """Every error in OpenAI's shape: ours, a request model's validation, and the framework's (404, 405, ...)."""

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
        return _error(e)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, e: RequestValidationError):
        return _error(ApiError(400, *_validation_message(list(e.errors()))))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, e: StarletteHTTPException):
        return _error(ApiError(e.status_code, str(e.detail)))


async def _complete(request: Request, session: Session, worker: EngineWorker, name: str, body, encode, chat: bool):
    """One completion request: checked, queued, then streamed back or collected whole."""
    if body.model not in (None, name):
        shown = body.model if len(body.model) <= 100 else body.model[:100] + "..."
        raise ApiError(404, f"the model '{shown}' does not exist; this server serves '{name}'", "model",
                       code="model_not_found")
    ids = await _encode(encode)
    config = _prepare(session, worker, body, ids)
    job = worker.submit(ids, config, body.stops, asyncio.get_running_loop())
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    head = {"id": rid, "created": int(time.time()), "model": name}
    if body.stream:
        return StreamingResponse(_stream(job, head, chat, body.include_usage), media_type="text/event-stream")
    collected = await _collect(job, request)
    if collected is None:
        return Response(status_code=CLIENT_GONE)
    content, done = collected
    choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if chat
              else {"index": 0, "text": content, "logprobs": None})
    choice["finish_reason"] = done.finish_reason
    if body.return_token_ids:
        choice.update(prompt_token_ids=list(ids), token_ids=list(done.token_ids))
    return {**head, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
            "usage": usage(done.prompt_tokens, done.completion_tokens), "eagle_trt": _extension(done)}


async def _encode(encode) -> list[int]:
    """The prompt's token ids, templated and tokenized in a worker thread (the engine has its own thread; the
    tokenizer's encode and the template's rendering may run beside it)."""
    try:
        return await asyncio.to_thread(encode)
    except EagleError as e:
        raise ApiError(400, str(e)) from None
    except jinja2.TemplateError as e:  # the chat template's raise_exception: roles out of order, ...
        raise ApiError(400, f"the chat template refused these messages: {e}", "messages") from None


async def _collect(job, request: Request) -> tuple[str, Finished] | None:
    """A whole (not streamed) answer: its text and end; None when the client disconnected first, in which case the
    job is cancelled at once and the engine drops it within one step."""
    async def answer():
        text = []
        async for kind, value in job.events():
            if kind == "text":
                text.append(value)
            elif kind == "error":
                raise value
            else:
                return "".join(text), value

    async def disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    answered, gone = asyncio.ensure_future(answer()), asyncio.ensure_future(disconnect())
    try:
        await asyncio.wait({answered, gone}, return_when=asyncio.FIRST_COMPLETED)
        return answered.result() if answered.done() else None
    finally:
        answered.cancel()
        gone.cancel()
        job.cancel()  # a no-op once done; frees the engine when the client went away


def _token_prompt(session: Session, ids: list[int]) -> list[int]:
    """A prompt given as token ids, each checked against the engine's vocabulary."""
    vocab = session.runner.target.spec.vocab_size
    bad = next((t for t in ids if t >= vocab), None)
    if bad is not None:
        raise ApiError(400, f"prompt token id {bad} is outside this model's vocabulary of {vocab}", "prompt")
    return list(ids)


def _prepare(session: Session, worker: EngineWorker, body, ids: list[int]):
    """The request's decode settings, checked against the engine (and the KV budget) before anything is queued."""
    try:
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
    return config


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


def _error(e: ApiError) -> Response:
    # ASCII-escaped: a message quoting the client's text can always be encoded.
    return Response(json.dumps(e.body()), status_code=e.status, media_type="application/json")
