"""`convert --init-head DIR`: training starts from a trained head's weights and keeps its draft vocabulary."""

import json

import pytest
import torch
from conftest import write_random_head
from train_support import write_chats

from eagle_trt.convert import convert_model
from eagle_trt.convert.attach import attach_eagle3
from eagle_trt.convert.init_head import open_init_head
from eagle_trt.convert.load_target import load_target
from eagle_trt.errors import CheckpointError, InputError
from eagle_trt.models.weights import load_safetensors


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    return write_chats(tmp_path_factory.mktemp("data") / "chats.jsonl", [24] * 20)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    # d2t[i] = i (draft id i is target id 2i): a map no training data would pick, so a head that kept it shows
    # that the init head's vocabulary was used, not one chosen from the data.
    return write_random_head(tmp_path_factory.mktemp("head") / "h", seed=3, draft_vocab=64)


def test_weights_and_d2t_are_loaded_exactly(tiny_model_dir, head):
    init, vocab, width = open_init_head(head, trains=True, brings_own=False)
    assert (vocab, width) == (64, json.loads((head / "config.json").read_text())["intermediate_size"])
    model, _, _ = load_target(tiny_model_dir)
    model = attach_eagle3(model, 64)
    d2t = init.load_into(model)
    want = load_safetensors(head / "model.safetensors")
    got = model.eagle_module.state_dict()
    for name, value in want.items():
        if name != "d2t":
            assert torch.equal(got[name], value.to(got[name].dtype)), name
    assert torch.equal(d2t, want["d2t"])


def test_training_continues_from_the_head(tiny_model_dir, head, chats, tmp_path):
    out = tmp_path / "ckpt"
    convert_model(tiny_model_dir, out, steps=2, data=[chats], seq_len=48, batch_size=4, lr=1e-3, progress=False,
                  validate=False, calibrate_kv=False, init_head=head)
    w = load_safetensors(out / "draft" / "model.safetensors")
    start = load_safetensors(head / "model.safetensors")
    assert torch.equal(w["d2t"], start["d2t"])  # the head's own vocabulary, not the data's
    assert not torch.equal(w["fc.weight"], start["fc.weight"])  # trained
    # Two small steps move the weights a little from where the head was, far less than a fresh head is from it.
    assert (w["fc.weight"] - start["fc.weight"]).abs().max() < 0.05
    training = json.loads((out / "convert.json").read_text())["training"]
    assert training["config"]["init_head"] == str(head) and training["steps"] == 2


@pytest.mark.parametrize("options, message", [
    (dict(steps=0), "--init-head is where training starts"),
    (dict(steps=1, draft_vocab_size=32), "--draft-vocab-size 32 differs"),
])
def test_options_that_do_not_fit_are_refused(tiny_model_dir, head, chats, tmp_path, options, message):
    with pytest.raises(InputError, match=message):
        convert_model(tiny_model_dir, tmp_path / "x", data=[chats] if options["steps"] else None, progress=False,
                      init_head=head, **options)
    assert not (tmp_path / "x").exists()


def test_a_head_for_another_target_is_refused(tiny_model_dir, chats, tmp_path):
    other = write_random_head(tmp_path / "h", aux=(0, 2, 5), draft_vocab=64)
    with pytest.raises((InputError, CheckpointError), match="layers"):
        convert_model(tiny_model_dir, tmp_path / "x", steps=1, data=[chats], seq_len=48, progress=False,
                      validate=False, calibrate_kv=False, init_head=other, work_dir=tmp_path / "work")
    assert not (tmp_path / "x").exists()
    # refused as soon as the target is loaded: no dataset, no feature cache made first
    assert not (tmp_path / "work" / "dataset.json").exists() and not (tmp_path / "work" / "cache").exists()


def test_a_missing_dir_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="must be a head dir"):
        open_init_head(tmp_path / "nope", trains=True, brings_own=False)
