"""The OpenAI API's shapes as this server takes and answers them (chat completions, completions, errors).

Fields clients send that would change the answer and that the server does not implement (penalties, logit_bias,
tools, response_format, n > 1, ...) are a 400 naming the field, never silently ignored; fields that change nothing
here (user, metadata, ...) are accepted.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eagle_trt.prompt_sources import CHAT_ROLES

# Would change the output if honoured: refused unless at their neutral value.
_NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None, "tools": None, "tool_choice": None,
            "response_format": None, "functions": None, "logprobs": False, "top_logprobs": None, "echo": False,
            "best_of": None, "suffix": None, "repetition_penalty": 1, "min_p": 0}
MAX_STOPS = 4


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal[CHAT_ROLES]  # type: ignore[valid-type]
    content: str | list[dict]

    def text(self) -> str:
        """The message's text: a string, or the text parts of a content list (other parts are refused)."""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, "only text content parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)


class _Sampling(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, le=2**64 - 1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    # eagle-trt's own: "ar" decodes this request plainly (the reference every speculative answer equals; bench-serve
    # compares the two), "eagle" (default) speculatively.
    mode: Literal["eagle", "ar"] | None = None
    # As vLLM names it: the choice also carries the prompt's and the answer's token ids (not with stream).
    return_token_ids: bool = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        return stops

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n must be 1: this server returns one choice per request")
        for name, value in (self.model_extra or {}).items():
            if name in _NEUTRAL and value not in (_NEUTRAL[name], None):
                raise ValueError(f"{name} is not supported by this server (leave it out)")
        if self.return_token_ids and self.stream:
            raise ValueError("return_token_ids is answered without stream (leave one out)")
        return self

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    # A string, a list of one string, or (as OpenAI's API allows) the prompt's token ids: decoded as they are, no
    # template and no BOS added, so a client that tokenized the prompt itself gets exactly that prompt.
    prompt: str | list[str] | list[int]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and all(isinstance(t, int) for t in v):
            if min(v) < 0:
                raise ValueError("prompt token ids must be >= 0")
            return v
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("prompt must be one string, a list of one string, or a list of token ids")
            v = v[0]
        if not v:
            raise ValueError("prompt is empty")
        return v

    @property
    def limit(self) -> int | None:
        return self.max_tokens


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
