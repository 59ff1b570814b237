"""The ASGI layer in front of the app, where nothing has been parsed yet: the API key, the request body bounded by the
bytes actually received (chunked or not), requests still sending their body when the drain starts, and a catch-all
that answers any unexpected exception as an OpenAI-shaped 500 (logged with an id; no traceback to the client).

    app.add_middleware(Guard, api_key="KEY", max_body=4 * 2**20, draining=asyncio.Event())

Only /v1/* is guarded by the key and read ahead: /health and /metrics answer without the key, as vLLM's and
llama-server's do (a load balancer's probe and a Prometheus scrape carry none).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import uuid

from eagle_trt.serve.wire import ApiError

log = logging.getLogger("eagle_trt.serve")


class Guard:
    def __init__(self, app, api_key: str | None, max_body: int, draining: asyncio.Event):
        self.app, self.max_body, self.draining = app, max_body, draining
        self.key = api_key.encode("utf-8") if api_key is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if scope["path"].startswith("/v1/"):
                refusal = self._refusal(scope)
                body = None
                if refusal is None:
                    body, refusal = await self._body(receive)
                if refusal is not None:
                    return await answer(tracked, refusal, close=True)
                if body is None:
                    return  # the client left before it finished sending
                receive = _replay(body, receive)
            await self.app(scope, receive, tracked)
        except Exception as e:  # noqa: BLE001 - the catch-all: whatever a handler raised, OpenAI's shape answers
            eid = uuid.uuid4().hex[:12]
            log.error("error %s on %s %s: %s: %s", eid, scope.get("method"), scope.get("path"), type(e).__name__, e,
                      exc_info=_debug())
            if not started:
                await answer(tracked, ApiError(500, f"internal error (id {eid}); the server's log has its details",
                                               kind="server_error"))

    def _refusal(self, scope) -> ApiError | None:
        """401 without the key; 413 when Content-Length alone already says too large."""
        headers = dict(scope["headers"])
        if self.key is not None and not self._authorized(headers.get(b"authorization", b"")):
            return ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", kind="authentication_error")
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return self._too_large()
        return None

    def _authorized(self, header: bytes) -> bool:
        # The scheme is case-insensitive (RFC 7235); the key is compared in constant time.
        parts = header.split(None, 1)
        return len(parts) == 2 and parts[0].lower() == b"bearer" and hmac.compare_digest(parts[1].strip(), self.key)

    async def _body(self, receive) -> tuple[bytes | None, ApiError | None]:
        """The whole body, read until it passes max_body (413) or the drain starts before it has all arrived (503);
        None when the client disconnected."""
        chunks, size = [], 0
        drain = asyncio.ensure_future(self.draining.wait())
        try:
            while True:
                message = asyncio.ensure_future(receive())
                await asyncio.wait({message, drain}, return_when=asyncio.FIRST_COMPLETED)
                if not message.done():
                    message.cancel()  # the server's receive only waits for an event: cancelling it loses nothing
                    return None, ApiError(503, "the server is shutting down", kind="server_error")
                message = message.result()
                if message["type"] == "http.disconnect":
                    return None, None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body:
                    return None, self._too_large()
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks), None
        finally:
            drain.cancel()

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than {self.max_body} bytes")


def _replay(body: bytes, receive):
    """A receive that hands the app the body read ahead, then the server's own events (the disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed():
        return pending.pop() if pending else await receive()

    return replayed


async def answer(send, error: ApiError, close: bool = False) -> None:
    """An error response in OpenAI's shape, written to the ASGI channel (close: the body may be partly unread, so
    the connection cannot carry another request)."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _debug() -> bool:
    return os.environ.get("EAGLE_TRT_DEBUG", "") not in ("", "0", "false")
