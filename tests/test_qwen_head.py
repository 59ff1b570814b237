"""The shipped Qwen2.5-Coder-Instruct heads (heads/qwen2.5-coder-1.5b-instruct and -0.5b-instruct, docs/real_models.md
"A head for the Qwen models"): under 50 MB as q8_0 rows, and on the real target, kept in its GGUF blocks, each drafts
tokens the target accepts while the output stays plain decoding's token for token.

The file checks need nothing; the engine checks need the GGUFs in models/ (`make qwen`), which CI does not fetch:
they skip without them. Set EAGLE_TRT_QWEN15_GGUF or EAGLE_TRT_QWEN05_GGUF to use another copy.
"""

import json
import os
from pathlib import Path

import pytest
import yaml

from eagle_trt.timing import TickClock

REPO = Path(__file__).resolve().parents[1]
# size: (head dir, GGUF, hidden size, the target layers whose outputs the head reads)
HEADS = {
    "1.5b": (REPO / "heads" / "qwen2.5-coder-1.5b-instruct",
             Path(os.environ.get("EAGLE_TRT_QWEN15_GGUF", REPO / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")),
             1536, [1, 13, 24]),
    "0.5b": (REPO / "heads" / "qwen2.5-coder-0.5b-instruct",
             Path(os.environ.get("EAGLE_TRT_QWEN05_GGUF", REPO / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")),
             896, [1, 11, 20]),
}
NEW_TOKENS = 48
# Chat prompts of neither the head's training data nor the bench's sets.
PROMPTS = ["Write a Python function that merges two sorted lists into one sorted list.",
           "Explain in two sentences what a hash table is."]


@pytest.mark.parametrize("size", sorted(HEADS))
def test_head_files_are_small_and_match_the_target(size):
    from safetensors import safe_open

    from eagle_trt.interop.head_blocks import Q8_KEY

    head, _, hidden, aux_layers = HEADS[size]
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["vocab_size"] == 151936 and cfg["draft_vocab_size"] == 8192 and cfg["hidden_size"] == hidden
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == aux_layers
    total = sum(p.stat().st_size for p in head.iterdir())
    assert total < 50 * 2**20, f"{head.name} is {total / 2**20:.1f} MiB; heads/ ships under 50 MB"
    with safe_open(str(head / "model.safetensors"), "pt") as f:
        packed = json.loads(f.metadata()[Q8_KEY])
        dtypes = {k: str(f.get_slice(k).get_dtype()) for k in f.keys()}
    assert {"lm_head.weight", "fc.weight"} <= set(packed), sorted(packed)
    assert all(dtypes[k] == "U8" for k in packed)


@pytest.fixture(scope="module", params=sorted(HEADS))
def session(request, tmp_path_factory):
    head, gguf, _, _ = HEADS[request.param]
    if not gguf.is_file():
        pytest.skip(f"{gguf} not found; run `make qwen`")
    from eagle_trt.config import parse_config
    from eagle_trt.convert import convert_model
    from eagle_trt.engine.builder import build_engine
    from eagle_trt.runtime.session import Session

    tmp = tmp_path_factory.mktemp("qwen-head")
    convert_model(gguf, tmp / "ckpt", head=head, progress=False, calibrate_kv=False)  # no training
    shipped = yaml.safe_load((REPO / "configs" / f"qwen2.5-coder-{request.param}-eagle3.yaml").read_text())
    cfg = parse_config({"name": "qwen-head-test", "checkpoint_dir": str(tmp / "ckpt"), "dtype": "bfloat16",
                        "weights": "auto", "draft_weights": shipped["draft_weights"],  # as the shipped config builds it
                        "max_input_len": 256, "max_output_len": 64})
    build_engine(cfg, output_dir=tmp / "engine")
    # The configured trees (no step budget): what the head itself accepts.
    return Session.open(tmp / "engine", clock=TickClock(), budget=False)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_trained_head_drafts_and_stays_lossless(session, prompt):
    ids = session.encode(prompt)
    ar = session.runner.generate(ids, session.decode_config(tuned=False, max_new_tokens=NEW_TOKENS, mode="ar"))
    for tree in ("chain", "dynamic"):  # the head alone: no copies from the context
        res = session.runner.generate(ids, session.decode_config(tuned=False, max_new_tokens=NEW_TOKENS, tree=tree,
                                                                  lookup_tokens=0))
        assert res.token_ids == ar.token_ids, tree  # the int8 block kernels are row-invariant: exact
    # An untrained head's acceptance length is 1.00; this one's dynamic tree is well above it on chat answers.
    assert res.metrics.acceptance_length > 1.8, res.metrics.acceptance_length
