"""The run-time tokenizer (eagle_trt.tokenizer, no transformers import) gives transformers' ids and text for every call
the runtime makes: plain prompts, chat templates over the shipped chat set and HumanEval, decoding; on the tiny
byte-level tokenizer, on SmolLM2's and, where `make qwen` fetched them, on Qwen2.5's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_trt.bench.prompts import load_chat_set, load_humaneval
from eagle_trt.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
GGUFS = {
    "smollm2": REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-0.5b": REPO / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
EXTRA = ["", " ", "héllo wörld — ünïcode ✓ 日本語", "line1\n\n\tindented  spaces", "<|im_start|>user\nhi<|im_end|>",
         "def f(x):\n    return x ** 2  # comment"]


def pairs(tmp_path_factory, source: str):
    """(ours, transformers') over the same saved tokenizer dir."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp(source.replace(".", "_"))
    if source == "tiny":
        from make_tiny_model import make_tokenizer

        make_tokenizer().save_pretrained(out)
    else:
        gguf = GGUFS[source]
        if not gguf.is_file():
            pytest.skip(f"{gguf} not found (make model / make qwen)")
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    ref = AutoTokenizer.from_pretrained(str(out), local_files_only=True, clean_up_tokenization_spaces=False)
    return Tokenizer.load(out), ref


def as_list(ids):
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.mark.parametrize("source", ["tiny", "smollm2", "qwen2.5-0.5b"])
def test_same_ids_and_text_as_transformers(tmp_path_factory, source):
    ours, ref = pairs(tmp_path_factory, source)
    chats = [p.messages for p in load_chat_set()]
    stubs = [p.text for p in load_humaneval()[:40]]
    for messages in chats:
        for gen in (True, False):
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == as_list(
                ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)), messages
    for text in stubs + EXTRA:
        ids = ours(text).input_ids
        assert ids == as_list(ref(text).input_ids), text
        assert ours.encode(text, add_special_tokens=False) == as_list(ref(text, add_special_tokens=False))
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids) == ref.decode(ids)
    assert ours.eos_token_id == ref.eos_token_id and len(ours) == len(ref)
    assert ours.get_vocab() == ref.get_vocab()
    some = list(range(0, len(ref), max(1, len(ref) // 50)))
    assert ours.convert_ids_to_tokens(some) == ref.convert_ids_to_tokens(some)


def test_run_does_not_import_transformers(tiny_checkpoint, tmp_path):
    from conftest import build_tiny_engine

    engine = build_tiny_engine(tiny_checkpoint, tmp_path)
    code = ("import sys\nfrom eagle_trt.cli.app import main\nsys.argv = ['eagle-trt', 'run', '--engine', sys.argv[1], "
            "'--prompt', 'Hi', '--max-new-tokens', '4', '--json']\ntry:\n    main()\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\nassert 'transformers' not in sys.modules, 'transformers was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code, str(engine)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr


def test_templates_with_generation_blocks_and_helpers_render(tmp_path):
    """The template features transformers offers: {% generation %} blocks, loop controls, tojson keeping non-ASCII,
    raise_exception."""
    import jinja2

    from make_tiny_model import make_tokenizer

    tok = make_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'skip' %}{% continue %}{% endif %}"
                         "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}"
                         "{% else %}{{ m | tojson }}{% endif %}{% endfor %}"
                         "{% if messages | length > 3 %}{{ raise_exception('too long') }}{% endif %}")
    tok.save_pretrained(tmp_path)
    ours = Tokenizer.load(tmp_path)
    msgs = [{"role": "user", "content": "é"}, {"role": "skip", "content": "x"}, {"role": "assistant", "content": "ok"}]
    assert ours.apply_chat_template(msgs, tokenize=False) == '{"role": "user", "content": "é"}ok'
    with pytest.raises(jinja2.exceptions.TemplateError, match="too long"):
        ours.apply_chat_template(msgs + msgs, tokenize=False)
