"""One definition of the end tokens (eagle_trt.eos): config.json, generation_config.json and the tokenizer's eos_token,
used by run (eagle and ar), bench's HF baselines and convert alike. An end-of-turn id that only generation_config.json
names (Qwen2.5-Instruct's 151643) stops generation."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.eos import eos_from_files, eos_token_ids

cli = CliRunner()


def test_union_of_every_declaration(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 11]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 13, "content": "<|im_end|>"}],
                                                         "model": {"vocab": {"a": 0}}}))
    assert eos_from_files(tmp_path) == [7, 11, 13]
    assert eos_token_ids(None, 3, [3, 4], True, -1) == [3, 4]
    assert eos_from_files(tmp_path / "missing") == []


@pytest.fixture(scope="module")
def stop_token_engine(tiny_checkpoint, tmp_path_factory):
    """An engine whose generation_config.json alone names, as an end token, a token the greedy answer reaches."""
    from conftest import build_tiny_engine

    root = tmp_path_factory.mktemp("eos")
    (root / "plain").mkdir()
    (root / "stop").mkdir()
    plain = build_tiny_engine(tiny_checkpoint, root / "plain")
    out = run_json(plain, "--mode", "ar")["token_ids"]
    stop_at = next(i for i in range(4, len(out)) if out[i] not in out[:i] and out[i] != 257)
    ckpt = shutil.copytree(tiny_checkpoint, root / "ckpt")
    gen = ckpt / "target" / "generation_config.json"
    data = json.loads(gen.read_text()) if gen.is_file() else {}
    data["eos_token_id"] = [257, out[stop_at]]
    gen.write_text(json.dumps(data))
    assert json.loads((ckpt / "target" / "config.json").read_text())["eos_token_id"] == 257
    return build_tiny_engine(ckpt, root / "stop"), out[: stop_at + 1]


def run_json(engine, *args):
    r = cli.invoke(app, ["run", "--engine", str(engine), "--json", "--prompt", "Hello", "--max-new-tokens", "40",
                         *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("mode", [["--mode", "ar"], ["--lookup-tokens", "0"], ["--lookup-tokens", "4"]])
def test_generation_config_eos_stops_run(stop_token_engine, mode):
    engine, expected = stop_token_engine
    res = run_json(engine, *mode)
    assert res["token_ids"] == expected and res["metrics"]["stop_reason"] == "eos"


def test_bench_hf_baselines_stop_at_the_same_tokens(stop_token_engine):
    from eagle_trt.bench.methods import build_methods
    from eagle_trt.runtime.session import Session

    engine, expected = stop_token_engine
    session = Session.open(engine)
    assert expected[-1] in session.runner.eos_token_ids
    methods = build_methods(session, ["hf", "ar"])
    assert all(expected[-1] in m.eos for m in methods if m.name == "hf")


# ---- what convert writes: the files agree on the model's own end tokens -------------------------------------------

def _gguf_with_specials(path, bos: int, eos: int):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_tokenizer_takes_the_end_token_the_file_declares(tmp_path):
    """transformers' GGUF conversion of a BPE vocabulary builds eos_token from the bos id (SmolLM2: <|im_start|>
    instead of <|im_end|>); convert sets both from the GGUF's own tokenizer.ggml.{bos,eos}_token_id."""
    from make_tiny_model import make_tokenizer

    from eagle_trt.convert.load_target import gguf_special_ids, with_special_tokens

    ids = gguf_special_ids(_gguf_with_specials(tmp_path / "m.gguf", bos=256, eos=257))
    assert ids == {"bos_token": 256, "eos_token": 257}
    tok = make_tokenizer()
    tok.eos_token = tok.bos_token  # what the conversion hands back
    assert tok.eos_token_id == 256
    fixed = with_special_tokens(tok, ids)
    assert (fixed.bos_token_id, fixed.eos_token_id, fixed.eos_token) == (256, 257, "</s>")
    fixed.save_pretrained(tmp_path / "tok")
    assert json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())["eos_token"] == "</s>"
    assert with_special_tokens(make_tokenizer(), {"eos_token": 10**6}).eos_token == "</s>"  # out of vocabulary: kept


def test_convert_writes_every_end_token_into_generation_config(tiny_model_dir, tmp_path):
    from make_tiny_model import make_tokenizer
    from transformers import AutoModelForCausalLM

    from eagle_trt.convert.export import write_target
    from eagle_trt.eos import disagreement

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = make_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    tok.eos_token = "<|im_end|>"  # an instruct tokenizer ending on its end-of-turn token
    model.config.eos_token_id = model.generation_config.eos_token_id = 257
    write_target(model, tok, tmp_path / "target")
    gen = json.loads((tmp_path / "target" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == sorted({257, tok.eos_token_id})
    assert eos_from_files(tmp_path / "target") == gen["eos_token_id"]
    assert disagreement(tmp_path / "target") is None


def test_build_names_a_tokenizer_end_token_the_configs_lack(tmp_path):
    from eagle_trt.eos import disagreement

    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_start|>"}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 1, "content": "<|im_start|>"},
                                                                          {"id": 2, "content": "<|im_end|>"}]}))
    assert disagreement(tmp_path) == (
        f"{tmp_path / 'tokenizer_config.json'} names eos_token '<|im_start|>' (id 1), but config.json / "
        "generation_config.json end on [2]: generation also stops at 1; re-run `eagle-trt convert` (it writes the "
        "model's own end tokens) or fix eos_token there")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    assert disagreement(tmp_path) is None


def test_smollm2_gguf_ends_on_im_end():
    from pathlib import Path

    from eagle_trt.convert.load_target import load_tokenizer

    gguf = Path(__file__).resolve().parents[1] / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.is_file():
        pytest.skip(f"{gguf} not found (make model)")
    tok = load_tokenizer(gguf)
    assert (tok.eos_token, tok.eos_token_id, tok.bos_token, tok.bos_token_id) == ("<|im_end|>", 2, "<|im_start|>", 1)
