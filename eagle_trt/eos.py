"""Which tokens end an answer: one definition for `convert`, `run`, `bench` (its HF baselines included) and `tune`.

A model names its end tokens in up to three places, and instruct models often put an end-of-turn token in only one
of them (Qwen2.5-Instruct: 151645 in config.json and the tokenizer, 151643 in generation_config.json). Generation
stops at any of them, as transformers' `generate` does with its generation config.

    eos_token_ids(config.eos_token_id, generation_config.eos_token_id, tokenizer.eos_token_id)
    eos_from_files("engines/x/target", "engines/x/tokenizer")

`convert` writes generation_config.json with all of them (`generation_eos`), so the three files agree; `build`
warns where a checkpoint's tokenizer names an end token that neither config file ends on (`disagreement`).

    >>> generation_eos(2, [2], 7), generation_eos(2, None, None)
    ([2, 7], 2)
"""

from __future__ import annotations

import json
from pathlib import Path


def eos_token_ids(*values) -> list[int]:
    """The union of end-token ids given as ints, lists of ints or None, sorted."""
    out: set[int] = set()
    for v in values:
        for i in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(i, int) and not isinstance(i, bool) and i >= 0:
                out.add(i)
    return sorted(out)


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _tokenizer_eos(directory: Path) -> int | None:
    """The id of tokenizer_config.json's eos_token, looked up in tokenizer.json (its added tokens, then its
    vocabulary), without loading a tokenizer."""
    name = _json(directory / "tokenizer_config.json").get("eos_token")
    if isinstance(name, dict):
        name = name.get("content")
    if not isinstance(name, str):
        return None
    tok = _json(directory / "tokenizer.json")
    for added in tok.get("added_tokens") or []:
        if isinstance(added, dict) and added.get("content") == name and isinstance(added.get("id"), int):
            return added["id"]
    vocab = (tok.get("model") or {}).get("vocab")
    return vocab.get(name) if isinstance(vocab, dict) else None


def eos_from_files(*dirs: str | Path, tokenizer=None) -> list[int]:
    """End tokens a model dir (and its tokenizer dir, when apart) declares: config.json's and generation_config.json's
    eos_token_id and the tokenizer's eos_token (from `tokenizer` when one is loaded already, else from the files)."""
    values = [tokenizer.eos_token_id] if tokenizer is not None else []
    for d in map(Path, dirs):
        values += [_json(d / "config.json").get("eos_token_id"), _json(d / "generation_config.json").get("eos_token_id")]
        if tokenizer is None:
            values.append(_tokenizer_eos(d))
    return eos_token_ids(*values)


def generation_eos(*values) -> int | list[int] | None:
    """generation_config.json's eos_token_id for these end tokens: one int, a sorted list when several, or None."""
    ids = eos_token_ids(*values)
    return None if not ids else ids[0] if len(ids) == 1 else ids


def disagreement(directory: str | Path) -> str | None:
    """Why a model dir's tokenizer and its config files name different end tokens (one line), or None when the
    tokenizer's eos_token is one config.json or generation_config.json ends on (or either side names none)."""
    directory = Path(directory)
    named = _tokenizer_eos(directory)
    configs = eos_token_ids(_json(directory / "config.json").get("eos_token_id"),
                            _json(directory / "generation_config.json").get("eos_token_id"))
    if named is None or not configs or named in configs:
        return None
    token = _json(directory / "tokenizer_config.json").get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    return (f"{directory / 'tokenizer_config.json'} names eos_token {token!r} (id {named}), but config.json / "
            f"generation_config.json end on {configs}: generation also stops at {named}; re-run `eagle-trt convert` "
            "(it writes the model's own end tokens) or fix eos_token there")
