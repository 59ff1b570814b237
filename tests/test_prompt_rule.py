"""One rule turns a prompt into token ids in `run`, `bench`/`tune` and `convert --data`: the chat template unless the
row says "chat": false; and prompt files that are not UTF-8 are one-line input errors."""

import json

import pytest

from eagle_trt.bench.prompts import load_prompts
from eagle_trt.convert.data import Record, prompt_ids as record_prompt_ids, read_records
from eagle_trt.errors import InputError
from eagle_trt.prompt_sources import prompt_ids


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from eagle_trt.tokenizer import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_bench_prompt_rows_use_the_template_like_run_and_convert(tokenizer, tmp_path):
    rows = [{"prompt": "Name a colour."}, {"prompt": "Name a colour.", "chat": True},
            {"messages": [{"role": "user", "content": "Name a colour."}]},
            {"prompt": "def f(x):", "chat": False}]
    bench = [p.encode(tokenizer) for p in load_prompts(str(write_rows(tmp_path / "p.jsonl", rows)))]
    templated = tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}],
                                              add_generation_prompt=True, tokenize=True)
    templated = list(templated["input_ids"] if hasattr(templated, "keys") else templated)
    assert bench[0] == bench[1] == bench[2] == templated == prompt_ids(tokenizer, "Name a colour.")
    assert bench[3] == list(tokenizer("def f(x):").input_ids) == prompt_ids(tokenizer, "def f(x):", chat=False)
    # convert --data reads the same rows the same way
    records = read_records([tmp_path / "p.jsonl"])
    assert [record_prompt_ids(r, tokenizer, 1 << 20) for r in records] == bench


def test_run_encodes_by_the_same_rule(tokenizer, tiny_checkpoint, tmp_path):
    from conftest import build_tiny_engine

    from eagle_trt.runtime.session import Session

    session = Session.open(build_tiny_engine(tiny_checkpoint, tmp_path))
    assert session.encode("Name a colour.") == prompt_ids(session.tokenizer, "Name a colour.")
    assert session.encode("Name a colour.", chat=False) == list(session.tokenizer("Name a colour.").input_ids)


def test_a_tokenizer_without_a_template_sends_a_lone_prompt_as_it_is(tokenizer):
    class Plain:
        chat_template = None

        def __call__(self, text):
            return tokenizer(text)

    assert prompt_ids(Plain(), "hello") == list(tokenizer("hello").input_ids)
    two = prompt_ids(Plain(), [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert two == list(tokenizer("system: be brief\nuser: hi\nassistant: ").input_ids)
    assert Record("prompt", "x", text="hi").chat  # a prompt row is a chat turn unless it says otherwise


@pytest.mark.parametrize("reader", ["bench", "convert"])
def test_non_utf8_prompt_files_are_input_errors(tmp_path, reader):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"latin1.jsonl:2: not UTF-8 text .*save the file as UTF-8"):
        load_prompts(str(path)) if reader == "bench" else read_records([path])
