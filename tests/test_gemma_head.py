"""The shipped Gemma 3 270M head (heads/gemma3-270m, docs/real_models.md "A trained head"): small enough to ship,
and on the real target it drafts tokens the target accepts, with the output plain decoding's token for token.

The file checks need nothing; the engine checks need models/gemma-3-270m-q4_k_m.gguf (`make gemma`), which CI does
not fetch: they skip without it. Set EAGLE_TRT_GEMMA_GGUF to use another copy.
"""

import json
import os
from pathlib import Path

import pytest

from eagle_trt.timing import TickClock

REPO = Path(__file__).resolve().parents[1]
HEAD = REPO / "heads" / "gemma3-270m"
GGUF = Path(os.environ.get("EAGLE_TRT_GEMMA_GGUF", REPO / "models" / "gemma-3-270m-q4_k_m.gguf"))
NEW_TOKENS = 48
# Raw completions, as the base model is prompted; none of them is in the head's training data or the bench's sets.
PROMPTS = ["def is_palindrome(text: str) -> bool:\n    \"\"\"Return True if text reads the same backwards.\"\"\"\n",
           "The three largest cities in Germany are"]


def test_head_files_are_small_and_match_the_target():
    from safetensors import safe_open

    cfg = json.loads((HEAD / "config.json").read_text())
    assert cfg["vocab_size"] == 262144 and cfg["draft_vocab_size"] == 16384 and cfg["hidden_size"] == 640
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 8, 14]
    size = sum(p.stat().st_size for p in HEAD.iterdir())
    assert size < 50 * 2**20, f"heads/gemma3-270m is {size / 2**20:.1f} MiB; heads/ ships under 50 MB"
    with safe_open(str(HEAD / "model.safetensors"), "pt") as f:
        dtypes = {k: str(f.get_slice(k).get_dtype()) for k in f.keys()}
        assert f.get_slice("d2t").get_shape() == [16384]
    assert dtypes.pop("d2t") == "I64"
    assert set(dtypes.values()) <= {"F16", "BOOL"}, dtypes


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    if not GGUF.is_file():
        pytest.skip(f"{GGUF} not found; run `make gemma`")
    from eagle_trt.config import parse_config
    from eagle_trt.convert import convert_model
    from eagle_trt.engine.builder import build_engine
    from eagle_trt.runtime.session import Session

    tmp = tmp_path_factory.mktemp("gemma-head")
    convert_model(GGUF, tmp / "ckpt", head=HEAD, progress=False, calibrate_kv=False)  # no training
    cfg = parse_config({"name": "gemma-head-test", "checkpoint_dir": str(tmp / "ckpt"), "dtype": "bfloat16",
                        "max_input_len": 256, "max_output_len": 64})
    build_engine(cfg, output_dir=tmp / "engine")
    return Session.open(tmp / "engine", clock=TickClock())


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_trained_head_drafts_and_stays_lossless(session, prompt):
    ids = session.encode(prompt, chat=False)
    ar = session.runner.generate(ids, session.decode_config(tuned=False, max_new_tokens=NEW_TOKENS, mode="ar"))
    for tree in ("chain", "dynamic"):  # the head alone: no copies from the context
        res = session.runner.generate(ids, session.decode_config(tuned=False, max_new_tokens=NEW_TOKENS, tree=tree,
                                                                  lookup_tokens=0))
        assert res.token_ids == ar.token_ids, tree  # bf16 kernels are row-invariant: exact
    # The target accepts some of the head's drafts (an untrained head's: none, acceptance length 1.00). The shipped
    # head is weakly trained (top-1 0.2): its dynamic tree measured 1.45 and 1.25 on these prompts; a chain of its
    # single best guesses can go unaccepted on a short continuation.
    assert res.metrics.acceptance_length > 1.15, res.metrics.acceptance_length
