"""JSON over HTTP to one OpenAI-compatible server, with bounded retries: what `convert --regenerate-endpoint` sends.

    ep = Endpoint("http://127.0.0.1:8000", api_key=None, timeout_s=600, retry=Retry(5))
    ep.get("/v1/models")                                  # -> the parsed JSON object
    ep.post("/v1/completions", {"model": "m", "prompt": [1, 2, 3], "max_tokens": 8})

The standard library's urllib: regeneration needs no HTTP package beyond what convert already installs.
A connection error, a timeout, a 429 or a 5xx is retried after 0.5 s, 1 s, 2 s, ... (at most 8 s each), up to
`Retry.attempts` more tries, then `EndpointDown`; any other 4xx is `EndpointRefused` at once (asking again would get
the same answer). Both are `EndpointError`s whose one-line message names the URL and what the server said.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from eagle_trt.errors import EndpointError

MAX_ERROR_CHARS = 300  # of a server's error text quoted in a message


class EndpointDown(EndpointError):
    """The server could not be reached, or kept failing (5xx, 429), for every try."""


class EndpointRefused(EndpointError):
    """The server answered 4xx: this request will not succeed there."""

    def __init__(self, message: str, status: int, server_says: str):
        super().__init__(message)
        self.status, self.server_says = status, server_says


class Stopped(Exception):
    """The run is stopping (another request failed, or Ctrl-C): a retry's wait was cut short."""


@dataclass(frozen=True)
class Retry:
    attempts: int  # tries after the first
    base_s: float = 0.5
    cap_s: float = 8.0

    def delay(self, k: int) -> float:
        """Seconds to wait before retry k (0-based): doubling from base_s, capped."""
        return min(self.cap_s, self.base_s * 2 ** k)


def base_url(url: str) -> str:
    """'http(s)://host[:port][/prefix][/v1][/]' -> the URL without the trailing '/v1' and '/'; an InputError-class
    message for anything else."""
    raw = url.strip()
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError(f"--regenerate-endpoint '{url}': give http://HOST:PORT or https://HOST[:PORT] (the "
                            "server's base URL, with or without /v1)")
    if parts.username is not None or parts.password is not None:
        raise EndpointError(f"--regenerate-endpoint '{parts.hostname}': no user or password in the URL (it is "
                            "recorded in convert.json); give the key with --regenerate-api-key")
    if parts.query or parts.fragment:
        raise EndpointError(f"--regenerate-endpoint '{url}': a base URL has no query or fragment")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        raise EndpointError(f"--regenerate-endpoint '{url}': the port is not a number in [0, 65535]") from None
    path = parts.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class Endpoint:
    def __init__(self, url: str, api_key: str | None, timeout_s: float, retry: Retry,
                 stop: threading.Event | None = None):
        self.url, self.api_key, self.timeout_s, self.retry = base_url(url), api_key, timeout_s, retry
        self.stop = stop or threading.Event()

    def get(self, path: str) -> dict:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict) -> dict:
        return self._call("POST", path, json.dumps(body).encode())

    def _call(self, method: str, path: str, data: bytes | None) -> dict:
        last = ""
        for k in range(self.retry.attempts + 1):
            if k:
                if self.stop.wait(self.retry.delay(k - 1)):
                    raise Stopped()
            try:
                return self._once(method, path, data)
            except _Retryable as e:
                last = str(e)
        tries = self.retry.attempts + 1
        raise EndpointDown(f"{self.url}{path}: {last} ({tries} {'try' if tries == 1 else 'tries'}); is the server "
                           "running and reachable from here?")

    def _once(self, method: str, path: str, data: bytes | None) -> dict:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            says = _server_says(e)
            if e.code == 429 or e.code >= 500:
                raise _Retryable(f"HTTP {e.code}: {says}") from None
            raise EndpointRefused(f"{self.url}{path}: HTTP {e.code}: {says}", e.code, says) from None
        except urllib.error.URLError as e:
            raise _Retryable(f"cannot connect ({_reason(e.reason)})") from None
        except (TimeoutError, socket.timeout):
            raise _Retryable(f"no answer within {self.timeout_s:g} s") from None
        except (http.client.HTTPException, ConnectionError, OSError) as e:
            raise _Retryable(f"the connection failed ({_reason(e)})") from None
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EndpointRefused(f"{self.url}{path}: the answer is not JSON ({raw[:80]!r}); is this an "
                                  "OpenAI-compatible server?", 200, "") from None
        if not isinstance(doc, dict):
            raise EndpointRefused(f"{self.url}{path}: the answer is not a JSON object", 200, "")
        return doc


class _Retryable(Exception):
    pass


def _reason(e) -> str:
    if isinstance(e, socket.timeout | TimeoutError):
        return "timed out"
    return (getattr(e, "strerror", None) or str(e) or type(e).__name__).strip()


def _server_says(e: urllib.error.HTTPError) -> str:
    """The error text of an OpenAI-style error body ({"error": {"message"}}, vLLM's {"message"}, FastAPI's
    {"detail"}), else the start of the body, on one line."""
    try:
        body = e.read().decode("utf-8", errors="replace")
    except OSError:
        body = ""
    text = body
    try:
        doc = json.loads(body)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        if isinstance(err, dict):
            text = err.get("message") or err.get("detail") or body
        elif isinstance(err, str):
            text = err
    except (json.JSONDecodeError, AttributeError):
        pass
    text = " ".join(str(text).split()) or (e.reason if isinstance(e.reason, str) else "no details")
    return text[:MAX_ERROR_CHARS]
