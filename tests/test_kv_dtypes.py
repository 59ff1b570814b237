"""Every (dtype, kv_cache_dtype) pair the config accepts builds and runs: a cache stored in another dtype than the
weights is cast on write and back on read (models/kv_cache.py), for the target and the head alike.

Greedy speculative output equals plain decoding of the same engine for every pair but fp8, where K/V rounding can
land on an FP8 boundary (the config labels it lossy)."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from eagle_trt.cli.app import app

cli = CliRunner()
DTYPES = ["float32", "bfloat16"]
KV = ["auto", "float32", "float16", "bfloat16", "fp8"]


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("kv")
    out = {}
    for dtype in DTYPES:
        for kv in KV:
            cfg = root / f"{dtype}-{kv}.yaml"
            cfg.write_text(yaml.safe_dump(dict(name="tiny", checkpoint_dir=str(tiny_checkpoint), dtype=dtype,
                                               kv_cache_dtype=kv, max_input_len=64, max_output_len=64,
                                               draft_length=4, total_tokens=12, beam_width=4)))
            r = cli.invoke(app, ["build", "--config", str(cfg), "--output", str(root / f"{dtype}-{kv}")])
            assert r.exit_code == 0, r.output
            out[dtype, kv] = root / f"{dtype}-{kv}"
    return out


def run_json(engine, *args):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--json", "--prompt", "Hello there", "--max-new-tokens",
                         "20", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_pair_runs(engines, dtype, kv):
    ar = run_json(engines[dtype, kv], "--mode", "ar")
    sd = run_json(engines[dtype, kv], "--lookup-tokens", "0")
    lookup = run_json(engines[dtype, kv], "--lookup-tokens", "4")
    assert len(ar["token_ids"]) == len(sd["token_ids"]) == 20
    if kv != "fp8":
        assert sd["token_ids"] == ar["token_ids"] == lookup["token_ids"]
    sampled = run_json(engines[dtype, kv], "--temperature", "0.8", "--seed", "3")
    assert len(sampled["token_ids"]) == 20


def test_a_wider_cache_changes_nothing(engines):
    """bf16 weights with an fp32 cache store bf16 values exactly: the same tokens as the bf16 cache."""
    assert (run_json(engines["bfloat16", "float32"], "--mode", "ar")["token_ids"]
            == run_json(engines["bfloat16", "auto"], "--mode", "ar")["token_ids"])
