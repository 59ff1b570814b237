"""The tokenizer agreement a draft model needs (eagle_trt.tokenizer_match): the first difference, named."""

from eagle_trt.tokenizer_match import first_difference

VOCAB = {"a": 0, "b": 1, "<s>": 2, "</s>": 3}
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def test_the_same_tokenizer_agrees():
    assert first_difference(VOCAB, SPECIALS, dict(VOCAB), dict(SPECIALS)) is None


def test_differences_in_id_order_then_special_roles():
    assert first_difference(VOCAB, SPECIALS, {**VOCAB, "a": 1, "b": 0}, SPECIALS) == (
        "token id 0 is 'a' in the target's tokenizer and 'b' in the draft's")
    assert first_difference(VOCAB, SPECIALS, {**VOCAB, "<x>": 4}, SPECIALS) == (
        "token id 4 ('<x>') is in the draft's tokenizer, not in the target's")
    assert first_difference({**VOCAB, "<y>": 4}, SPECIALS, VOCAB, SPECIALS) == (
        "token id 4 ('<y>') is in the target's tokenizer, not in the draft's")
    assert first_difference(VOCAB, SPECIALS, VOCAB, {**SPECIALS, "eos_token": "<s>"}) == (
        "the eos token is '</s>' in the target's tokenizer and '<s>' in the draft's")
    assert first_difference(VOCAB, SPECIALS, VOCAB, {"bos_token": "<s>"}) == (
        "the eos token is '</s>' in the target's tokenizer and None in the draft's")
