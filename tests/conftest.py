"""Shared fixtures: tiny random models built from inline configs (nothing is downloaded)."""

import json
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# Tiny models are dominated by per-op overhead, where a second OpenMP thread only adds waiting (badly so
# when the machine is busy). One thread keeps the suite fast and its timing stable.
torch.set_num_threads(int(os.environ.get("EAGLE_TRT_TEST_THREADS", "1")))
# Engines' runtime weight layouts (models/weight_cache.py) go to a dir of this run's, not the user's cache: every test
# that opens an engine twice reads it back from there.
if "EAGLE_TRT_WEIGHT_CACHE" not in os.environ:
    os.environ["EAGLE_TRT_WEIGHT_CACHE"] = tempfile.mkdtemp(prefix="eagle-trt-test-weights-")
    atexit.register(shutil.rmtree, os.environ["EAGLE_TRT_WEIGHT_CACHE"], ignore_errors=True)
sys.path.insert(0, str(REPO / "scripts"))

from make_tiny_model import TINY_CONFIG, make_tiny_model  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--clock", choices=("wall", "jitter"), default=os.environ.get("EAGLE_TRT_TEST_CLOCK", "wall"),
                     help="jitter: every component that reads eagle_trt.timing.now gets a seeded random clock "
                          "instead of the wall clock, to find tests whose assertions hang on timings "
                          "(tests/timing_support.py); env EAGLE_TRT_TEST_CLOCK")


def pytest_configure(config):
    if config.getoption("--clock") == "jitter":
        from eagle_trt import timing
        from timing_support import JitterClock

        timing.now = JitterClock(seed=int(os.environ.get("EAGLE_TRT_TEST_CLOCK_SEED", "0")))


def write_random_head(out: Path, seed: int = 1, aux=(1, 3, 4), draft_vocab: int | None = None, scale=0.1,
                      vocab: int | None = None) -> Path:
    """A random EAGLE-3 head in modelopt's export layout for the tiny target (no modelopt needed)."""
    from safetensors.torch import save_file

    c = TINY_CONFIG
    h, nh, kv, hd, inter, v = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                               c["intermediate_size"], vocab or c["vocab_size"])
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * scale  # noqa: E731
    p = "layers.0."
    w = {
        "fc.weight": r(h, len(aux) * h),
        p + "hidden_norm.weight": 1 + r(h), p + "input_layernorm.weight": 1 + r(h),
        p + "self_attn.q_proj.weight": r(nh * hd, 2 * h), p + "self_attn.k_proj.weight": r(kv * hd, 2 * h),
        p + "self_attn.v_proj.weight": r(kv * hd, 2 * h), p + "self_attn.o_proj.weight": r(h, nh * hd),
        p + "post_attention_layernorm.weight": 1 + r(h),
        p + "mlp.gate_proj.weight": r(inter, h), p + "mlp.up_proj.weight": r(inter, h),
        p + "mlp.down_proj.weight": r(h, inter), "norm.weight": 1 + r(h),
    }
    dv = draft_vocab or v
    if draft_vocab:
        w["lm_head.weight"] = r(dv, h)
        # draft id i -> target id 2*i (a sparse, non-trivial map)
        w["d2t"] = torch.arange(dv, dtype=torch.long)
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / "model.safetensors"))
    cfg = dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=h, num_attention_heads=nh,
               num_key_value_heads=kv, head_dim=hd, intermediate_size=inter, rms_norm_eps=1e-6, rope_theta=10000.0,
               max_position_embeddings=c["max_position_embeddings"], vocab_size=v, draft_vocab_size=dv,
               eagle_aux_hidden_state_layer_ids=list(aux), num_hidden_layers=1,
               # what modelopt's export nests there, and what tells its layout from vLLM's (interop/detect.py)
               eagle_config=dict(eagle_aux_hidden_state_layer_ids=list(aux), use_input_layernorm_in_first_layer=True))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def family_model_dir(tmp_path_factory):
    """family name -> a tiny random model of that family (scripts/make_tiny_model.py FAMILIES), made once."""
    made = {}

    def make(family: str) -> Path:
        if family not in made:
            made[family] = make_tiny_model(tmp_path_factory.mktemp(family) / "model", seed=0, family=family)
        return made[family]

    return make


@pytest.fixture(scope="session")
def tiny_head_dir(tmp_path_factory) -> Path:
    return write_random_head(tmp_path_factory.mktemp("tiny") / "draft")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_model_dir, tmp_path_factory) -> Path:
    """`eagle-trt convert` of the tiny model (untrained head), made once through the CLI."""
    from typer.testing import CliRunner

    from eagle_trt.cli.app import app

    out = tmp_path_factory.mktemp("ckpt") / "ckpt"
    r = CliRunner().invoke(app, ["convert", str(tiny_model_dir), "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return out


def build_tiny_engine(checkpoint: Path, tmp: Path) -> Path:
    """`eagle-trt build` of a tiny checkpoint into tmp/engine (each test module gets its own engine)."""
    from typer.testing import CliRunner

    from eagle_trt.cli.app import app

    cfg = tmp / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {checkpoint}\nmax_input_len: 64\nmax_output_len: 128\n")
    r = CliRunner().invoke(app, ["build", "--config", str(cfg), "--output", str(tmp / "engine")])
    assert r.exit_code == 0, r.output
    return tmp / "engine"
