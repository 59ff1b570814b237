"""The run-time tokenizer: `tokenizer.json` through the `tokenizers` library and the chat template through jinja2,
without importing transformers (whose import alone costs seconds at every start).

    tok = Tokenizer.load("engines/x/tokenizer")
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    text = tok.decode(ids, skip_special_tokens=True)

It gives transformers' ids for the same calls (tests/test_tokenizer.py checks it on the shipped prompt sets): the
saved tokenizer.json already holds the normalizer, pre-tokenizer and post-processor transformers used, and the
template renders in the environment transformers renders it in (a sandbox with trim_blocks, lstrip_blocks, loop
controls, a `tojson` that keeps non-ASCII text, `raise_exception` and `strftime_now`), with the special tokens
as variables, and the text is then encoded without special tokens. A dir without tokenizer.json (a sentencepiece
`tokenizer.model` alone) is loaded with transformers instead (`load_tokenizer`).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend

from eagle_trt.errors import CheckpointError

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Encoding(dict):
    """What `tokenizer(text)` returns: `.input_ids` (and ["input_ids"]), as transformers' BatchEncoding offers."""

    @property
    def input_ids(self) -> list[int]:
        return self["input_ids"]


class Tokenizer:
    def __init__(self, backend, config: dict, chat_template: str | None):
        self.backend = backend  # tokenizers.Tokenizer
        self.config = config
        self.chat_template = chat_template
        self.special_tokens_map = {k: _token_text(config.get(k)) for k in SPECIAL_KEYS
                                   if _token_text(config.get(k)) is not None}

    @classmethod
    def load(cls, directory: str | Path) -> "Tokenizer":
        directory = Path(directory)
        try:
            backend = Backend.from_file(str(directory / "tokenizer.json"))
            config = _json(directory / "tokenizer_config.json")
        except Exception as e:  # tokenizers raises its own Exception type for a bad file
            raise CheckpointError(f"{directory}: cannot load the tokenizer ({e})") from None
        template = config.get("chat_template")
        jinja_file = directory / "chat_template.jinja"  # transformers >= 4.50 saves the template on its own
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        return cls(backend, config, template or None)

    # ---- the calls the runtime makes ------------------------------------------------------------------
    def __call__(self, text: str, add_special_tokens: bool = True) -> Encoding:
        return Encoding(input_ids=self.encode(text, add_special_tokens))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False, tokenize: bool = True,
                            **kwargs):
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        text = self._compiled.render(messages=messages, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt,
                                     **{**self.special_tokens_map, **kwargs})
        return self.encode(text, add_special_tokens=False) if tokenize else text

    @property
    def eos_token_id(self) -> int | None:
        name = self.special_tokens_map.get("eos_token")
        return self.backend.token_to_id(name) if name is not None else None

    def convert_ids_to_tokens(self, ids) -> list[str | None]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def _compiled(self):
        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols, _generation_tag()])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)


def _generation_tag():
    """`{% generation %}...{% endgeneration %}` (templates that mark assistant turns for training masks) renders its
    body unchanged, as transformers does when it is not tracking those turns."""
    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return GenerationTag


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json stores it: a string, or an AddedToken dict with its content."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def load_tokenizer(directory: str | Path):
    """The engine's tokenizer: `Tokenizer` where the dir has tokenizer.json, else transformers' AutoTokenizer."""
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        return Tokenizer.load(directory)
    # Imported here: transformers takes seconds to import; only a dir without tokenizer.json needs it.
    from transformers import AutoTokenizer

    try:
        # clean_up_tokenization_spaces only suits WordPiece; off, decode gives the text as generated.
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False,
                                             clean_up_tokenization_spaces=False)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: cannot load the tokenizer ({e})") from None
