"""The tokenizer of a GGUF whose vocabulary is a sentencepiece BPE (`tokenizer.ggml.model` "llama" with merge-rank
scores, as Gemma 3's), rebuilt as the BPE it is.

    if needs_bpe_rebuild(path):
        tokenizer = gguf_bpe_tokenizer(path, loaded)   # loaded: the tokenizer transformers made from the GGUF

Why: transformers turns such a vocabulary into a model without its merges, which for Gemma 3 splits ordinary words
into single characters ("The capital" -> T, h, e, ...), so every prompt reaches the model as ids it was never
trained on. The scores are the sentencepiece BPE's piece scores (higher merges first), so the merges are
the pairs of pieces whose concatenation is a piece, ranked by that piece's score, as transformers ranks them when it
converts a sentencepiece BPE model (`convert_slow_tokenizer.generate_merges`); byte-fallback pieces (<0xNN>) cover
what no piece does. Special tokens, the BOS rule and the chat template are kept from the tokenizer transformers made.
"""

from __future__ import annotations

from pathlib import Path

# GGUF token types (gguf.TokenType): control tokens (<bos>, <eos>, ...) and user-defined ones (chat markers) are
# matched whole, never built by merges; byte tokens are the fallback.
_CONTROL, _USER, _BYTE = 3, 4, 6


def needs_bpe_rebuild(gguf_path: Path) -> bool:
    """Whether the GGUF's vocabulary is a sentencepiece BPE with merge scores that transformers does not rebuild as
    one (Gemma 3's)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    model = reader.get_field("tokenizer.ggml.model")
    return (model is not None and model.contents() == "llama" and reader.get_field("tokenizer.ggml.scores") is not None
            and reader.get_field("general.architecture").contents() == "gemma3")


def _vocab(reader) -> tuple[list[str], list[float], list[int]]:
    tokens = list(reader.get_field("tokenizer.ggml.tokens").contents())
    scores = [float(s) for s in reader.get_field("tokenizer.ggml.scores").contents()]
    types = [int(t) for t in reader.get_field("tokenizer.ggml.token_type").contents()]
    # A run of spaces is spelled as the normalizer writes it (underscores), as transformers' GGUF converter does. The
    # byte pieces keep their <0xNN> names: byte fallback looks them up by those.
    tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    return tokens, scores, types


def gguf_bpe_tokenizer(gguf_path: Path, loaded):
    """A transformers fast tokenizer: the GGUF's vocabulary as a byte-fallback BPE, with `loaded`'s special tokens,
    BOS rule and chat template."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import generate_merges

    reader = gguf.GGUFReader(str(gguf_path))
    tokens, scores, types = _vocab(reader)
    vocab = {t: i for i, t in enumerate(tokens)}
    whole = [t for t, k in zip(tokens, types) if k in (_CONTROL, _USER)]
    merges = generate_merges(vocab, [(t, s) for t, s, k in zip(tokens, scores, types) if k not in (_CONTROL, _BYTE)],
                             skip_tokens=whole)
    unk = loaded.unk_token or "<unk>"
    backend = Tokenizer(BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    # Control tokens match the raw text; user-defined pieces (newline and space runs, markup) are matched whole in the
    # normalized text, as sentencepiece extracts its user-defined symbols before its merges.
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, types) if k == _CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=True) for t, k in zip(tokens, types) if k == _USER])
    add_bos = reader.get_field("tokenizer.ggml.add_bos_token")
    bos = loaded.bos_token
    if bos is not None and (add_bos is None or bool(add_bos.contents())):
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    special = {k: getattr(loaded, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")
               if getattr(loaded, k, None) is not None}
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=loaded.chat_template,
                                   clean_up_tokenization_spaces=False, **special)
