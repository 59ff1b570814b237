"""trtllm bundles load with the oldest transformers a TensorRT-LLM line pins (1.2.x: 4.57.1).

That transformers runs in its own small venv (`make test` creates .venv-tf457: transformers 4.57.1 and
tokenizers, no torch) and reads the bundle's tokenizer and configs in a subprocess; the results are
compared with transformers 5 reading the same files in this process. The same reader on the
checkpoint's own files shows why the bundle rewrites them (class TokenizersBackend, theta 10000).

The target here uses rope_theta 100000, so silently falling back to 10000 cannot pass.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import write_random_head
from eagle_trt.config import EagleConfig
from eagle_trt.engine import build_engine
from eagle_trt.engine.trtllm_lines import LINES
from make_tiny_model import make_tiny_model

REPO = Path(__file__).resolve().parents[1]
THETA = 100000.0
TEXTS = ["hello world", "def f(x):\n    return x * 2  # done", "Ünïcödé & <tags> 123"]
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]

READER = r"""
import json, sys
import transformers
from transformers import AutoConfig, AutoTokenizer
root, texts, chat = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
out = {"transformers": transformers.__version__}
for sub in ("target", "tokenizer"):
    try:
        tok = AutoTokenizer.from_pretrained(f"{root}/{sub}")
        out[sub] = {"class": type(tok).__name__, "ids": [tok(t).input_ids for t in texts],
                    "special": [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id],
                    "chat": tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)}
    except Exception as exc:
        out[sub] = {"error": f"{type(exc).__name__}: {exc}"}
for sub in ("target", "draft"):
    try:
        cfg = AutoConfig.from_pretrained(f"{root}/{sub}")
        out[sub + "_config"] = {"rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
                                "model_type": cfg.model_type}
    except Exception as exc:
        out[sub + "_config"] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def old_python() -> str:
    path = os.environ.get("EAGLE_TRT_OLD_TRANSFORMERS") or str(REPO / ".venv-tf457" / "bin" / "python")
    if not Path(path).is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: `make test` creates it (transformers {LINES['1.2'].transformers_pin})")
        pytest.skip(f"no transformers {LINES['1.2'].transformers_pin} venv at {path} (`make test` creates it)")
    return path


def read_old(root: Path) -> dict:
    out = subprocess.run([old_python(), "-c", READER, str(root), json.dumps(TEXTS), json.dumps(CHAT)],
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tf") / "ckpt"
    make_tiny_model(root / "target", seed=0, rope_theta=THETA)
    draft = write_random_head(root / "draft")
    cfg = json.loads((draft / "config.json").read_text())
    # What modelopt exports: theta inside a "default" rope_scaling as well as at the top.
    cfg.update(rope_theta=THETA, rope_scaling={"rope_type": "default", "rope_theta": THETA}, model_type="llama")
    (draft / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.fixture(scope="module")
def bundles(ckpt, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for line in LINES:
        cfg = EagleConfig(name="tf", backend="trtllm", dtype="bfloat16", trtllm_version=line, max_input_len=256,
                          max_output_len=128, draft_length=4, total_tokens=12, beam_width=3, lookup_tokens=0)  # fmt: skip
        out[line] = build_engine(cfg, ckpt, tmp_path_factory.mktemp("b") / "e").engine_dir
    return out


def test_old_transformers_is_the_pinned_release():
    assert read_old(REPO)["transformers"] == LINES["1.2"].transformers_pin
    makefile = (REPO / "Makefile").read_text()
    assert f"TF_OLD     ?= {LINES['1.2'].transformers_pin}\n" in makefile


@pytest.mark.parametrize("line", list(LINES))
def test_bundle_reads_the_same_in_both_transformers(bundles, line):
    from transformers import AutoConfig, AutoTokenizer

    root = bundles[line]
    old = read_old(root)
    for sub in ("target", "tokenizer"):
        assert "error" not in old[sub], old[sub]
        tok = AutoTokenizer.from_pretrained(root / sub)
        assert old[sub]["ids"] == [tok(t).input_ids for t in TEXTS]
        assert old[sub]["special"] == [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id] == [256, 257, 258]
        assert old[sub]["chat"] == tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        assert old[sub]["class"] == "PreTrainedTokenizerFast"
    for sub in ("target", "draft"):
        assert old[f"{sub}_config"]["rope_theta"] == THETA, old[f"{sub}_config"]
        assert old[f"{sub}_config"]["rope_scaling"] is None  # no scaling: TensorRT-LLM's RoPE parser takes null
        new = AutoConfig.from_pretrained(root / sub)
        assert new.rope_parameters["rope_theta"] == THETA and new.rope_parameters["rope_type"] == "default"
    draft = json.loads((root / "draft" / "config.json").read_text())
    assert draft["rope_scaling"] is None and draft["rope_theta"] == THETA


def test_checkpoint_files_are_what_old_transformers_misreads(ckpt):
    # The control: without the bundle's rewrites, 4.57 cannot load the tokenizer and loses the RoPE theta.
    old = read_old(ckpt)
    assert "TokenizersBackend does not exist" in old["target"]["error"]
    assert old["target_config"]["rope_theta"] == 10000.0 != THETA
    target = json.loads((ckpt / "target" / "config.json").read_text())
    assert "rope_theta" not in target and target["rope_parameters"]["rope_theta"] == THETA
