"""Do two tokenizers agree? A draft model proposes token ids that the target verifies, so the two must mean the same
text by every id: the same vocabulary (token text -> id, added tokens included) and the same special tokens.

    first_difference(target_vocab, target_specials, draft_vocab, draft_specials)
    # None, or "token id 7 is 'ab' in the target's tokenizer and 'ac' in the draft's"

Used by `convert --draft-model` (transformers tokenizers, before any weights load) and by `build` (the checkpoint's
saved tokenizer files, through `eagle_trt.tokenizer`).
"""

from __future__ import annotations

from pathlib import Path

from eagle_trt.tokenizer import SPECIAL_KEYS, Tokenizer


def first_difference(target_vocab: dict[str, int], target_specials: dict[str, str | None],
                     draft_vocab: dict[str, int], draft_specials: dict[str, str | None]) -> str | None:
    """The first difference, in id order, then in special-token role order; None when they agree."""
    by_id = [{i: t for t, i in v.items()} for v in (target_vocab, draft_vocab)]
    for i in sorted(set(by_id[0]) | set(by_id[1])):
        a, b = by_id[0].get(i), by_id[1].get(i)
        if a == b:
            continue
        if a is None or b is None:
            where, other = ("target", "draft") if b is None else ("draft", "target")
            return f"token id {i} ({a if b is None else b!r}) is in the {where}'s tokenizer, not in the {other}'s"
        return f"token id {i} is {a!r} in the target's tokenizer and {b!r} in the draft's"
    for role in SPECIAL_KEYS:
        a, b = target_specials.get(role), draft_specials.get(role)
        if a != b:
            name = role.removesuffix("_token")
            return f"the {name} token is {a!r} in the target's tokenizer and {b!r} in the draft's"
    return None


def hf_tokenizer_terms(tokenizer) -> tuple[dict[str, int], dict[str, str | None]]:
    """(vocabulary, special tokens by role) of a transformers tokenizer."""
    specials = {role: _text(getattr(tokenizer, role, None)) for role in SPECIAL_KEYS}
    return dict(tokenizer.get_vocab()), specials


def saved_tokenizer_terms(directory: str | Path) -> tuple[dict[str, int], dict[str, str | None]]:
    """(vocabulary, special tokens by role) of a saved tokenizer dir (tokenizer.json + tokenizer_config.json)."""
    tok = Tokenizer.load(directory)
    specials = {role: tok.special_tokens_map.get(role) for role in SPECIAL_KEYS}
    return dict(tok.backend.get_vocab(with_added_tokens=True)), specials


def _text(token) -> str | None:
    if token is None:
        return None
    return str(getattr(token, "content", token))
