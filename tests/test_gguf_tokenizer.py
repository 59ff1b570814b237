"""A GGUF whose vocabulary is a sentencepiece BPE (Gemma 3's: tokenizer.ggml.model "llama", merge-rank scores) is
tokenized as that BPE (convert/gguf_tokenizer.py): merges in score order, user-defined pieces whole, byte fallback,
BOS added; written by gguf's own writer here, nothing downloaded."""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")

from eagle_trt.convert.gguf_tokenizer import gguf_bpe_tokenizer, needs_bpe_rebuild  # noqa: E402

NORMAL, CONTROL, USER, BYTE = 1, 3, 4, 6
SPECIAL = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", CONTROL)]
BYTES = [(f"<0x{b:02X}>", BYTE) for b in range(256)]
# Pieces in merge order (the score falls with the rank), then a user-defined run of two spaces.
PIECES = [("▁", NORMAL), ("a", NORMAL), ("b", NORMAL), ("c", NORMAL), ("ab", NORMAL), ("▁ab", NORMAL),
          ("abc", NORMAL), ("  ", USER)]


def write_gguf(path, arch="gemma3"):
    w = gguf.GGUFWriter(str(path), arch)
    vocab = SPECIAL + BYTES + PIECES
    w.add_tokenizer_model("llama")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_scores([-1000.0] * (len(SPECIAL) + len(BYTES)) + [-float(i) for i in range(len(PIECES))])
    w.add_token_types([k for _, k in vocab])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {t.replace(" ", "▁") if not t.strip() else t: i for i, (t, _) in enumerate(vocab)}


class Loaded:  # what transformers' own tokenizer contributes: the special tokens and the template
    bos_token, eos_token, unk_token, pad_token, mask_token, chat_template = "<bos>", "<eos>", "<unk>", "<pad>", None, None


def test_the_vocabulary_is_tokenized_as_its_bpe(tmp_path):
    ids = write_gguf(tmp_path / "tok.gguf")
    assert needs_bpe_rebuild(tmp_path / "tok.gguf")
    tok = gguf_bpe_tokenizer(tmp_path / "tok.gguf", Loaded())
    # ab first (the best score), then ▁ab; abc cannot form once ▁ab holds its ab.
    assert tok("ab abc").input_ids == [2, ids["ab"], ids["▁ab"], ids["c"]]
    # The user-defined two-space piece is matched whole; é has no piece and falls back to its UTF-8 bytes.
    assert tok("a  b").input_ids == [2, ids["a"], ids["▁▁"], ids["b"]]
    assert tok("é").input_ids == [2, ids["<0xC3>"], ids["<0xA9>"]]
    assert tok.decode(tok("ab abc é").input_ids, skip_special_tokens=True) == "ab abc é"
    # User-defined pieces are text, not special tokens: decoding without special tokens keeps them.
    assert tok.decode(tok("a  b").input_ids, skip_special_tokens=True) == "a  b"


def test_another_architecture_keeps_transformers_tokenizer(tmp_path):
    write_gguf(tmp_path / "tok.gguf", arch="llama")
    assert not needs_bpe_rebuild(tmp_path / "tok.gguf")
