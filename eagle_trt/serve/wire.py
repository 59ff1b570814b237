"""The OpenAI API's shapes as this server takes and answers them (chat completions, completions, errors).

Types are strict: a boolean or a string is never read as a number, nor a string as a boolean (`max_tokens: true`,
`stream: "yes"` and a completion `prompt` of `[true, false]` are 400s); an integer is a float where a float is asked
for (`temperature: 1`), as OpenAI's clients send it. Fields clients send that would change the answer and that the
server does not implement (penalties, logit_bias, tools, response_format, logprobs, n > 1, ...) are a 400 naming
the field unless they hold their neutral value, of its type (`presence_penalty: 0`, `echo: false`); fields that
change nothing here (user, metadata, ...) are accepted. Text is checked as `run` checks a prompt: UTF-8, and not
empty.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eagle_trt.prompt_sources import CHAT_ROLES

MAX_STOPS = 4
# What a field of several shapes may be, said when a value is none of them.
UNION_RULES = {"prompt": "must be a string, a list of one string, or a list of token ids (integers)",
               "content": "must be a string or a list of text parts", "stop": "must be a string or a list of strings"}
STRICT = ConfigDict(strict=True, allow_inf_nan=False)


def _number(neutral: float) -> Callable[[object], bool]:
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == neutral


def _empty(v) -> bool:
    return isinstance(v, (dict, list)) and not v


# Would change the output if honoured: refused unless left out, null, or at the neutral value of the field's type.
_NEUTRAL: dict[str, Callable[[object], bool]] = {
    "presence_penalty": _number(0), "frequency_penalty": _number(0), "repetition_penalty": _number(1),
    "min_p": _number(0), "logit_bias": _empty, "tools": _empty, "functions": _empty,
    "tool_choice": lambda v: v == "none", "response_format": lambda v: v == {"type": "text"},
}
# Chat's logprobs is a boolean; a completion's is a count (0 already asks for the sampled token's logprob).
_CHAT_NEUTRAL = {**_NEUTRAL, "logprobs": lambda v: v is False, "top_logprobs": _number(0)}
_COMPLETION_NEUTRAL = {**_NEUTRAL, "logprobs": lambda v: v is False, "echo": lambda v: v is False,
                       "best_of": _number(1), "suffix": lambda v: v == ""}


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def check_text(text: str, what: str) -> str:
    """A ValueError when the text is not UTF-8 (a lone surrogate, which JSON's \\u escapes can spell)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not UTF-8 text (a lone surrogate at character {e.start})") from None
    return text


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", **STRICT)
    include_usage: bool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", **STRICT)
    role: Literal[CHAT_ROLES]  # type: ignore[valid-type]
    content: str | list[dict]

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v):
        """A string, or text parts only (other parts, images and the like, are refused)."""
        if isinstance(v, str):
            return check_text(v, "content")
        for part in v:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            check_text(part["text"], "content")
        return v

    def text(self) -> str:
        """The message's text: the string, or its text parts joined."""
        return self.content if isinstance(self.content, str) else "".join(p["text"] for p in self.content)


class _Sampling(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="allow", **STRICT)
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

    neutral: ClassVar[dict[str, Callable[[object], bool]]] = _NEUTRAL  # the endpoint's fields refused unless neutral

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        return [check_text(s, "a stop string") for s in stops]

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n must be 1: this server returns one choice per request")
        for name, value in (self.model_extra or {}).items():
            if name in self.neutral and value is not None and not self.neutral[name](value):
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

    neutral = _CHAT_NEUTRAL

    @field_validator("messages")
    @classmethod
    def _some_text(cls, v):
        if not any(m.text().strip() for m in v):
            raise ValueError("the messages hold no text")
        return v

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def text_length(self) -> int:
        return sum(len(m.text()) for m in self.messages)


class CompletionRequest(_Sampling):
    # A string, a list of one string, or (as OpenAI's API allows) the prompt's token ids: decoded as they are, no
    # template and no BOS added, so a client that tokenized the prompt itself gets exactly that prompt.
    prompt: str | list[str] | list[int]

    neutral = _COMPLETION_NEUTRAL

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
        if not v.strip():
            raise ValueError("prompt is empty")
        return check_text(v, "prompt")

    @property
    def limit(self) -> int | None:
        return self.max_tokens

    @property
    def text_length(self) -> int:
        return len(self.prompt)  # characters of a text prompt, or the number of token ids


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
