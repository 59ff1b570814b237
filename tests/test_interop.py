"""`eagle-trt export` for each engine, checked by numerics: the engines' reference draft layers (written from their
source, tests/interop_reference.py) on the exported files give the logits eagle-trt's runtime computes the engine's
way, from the same target features; and what export calls exact is exact."""

import json

import pytest
import torch
from conftest import write_random_head
from interop_reference import REFERENCES
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.convert import convert_model
from eagle_trt.errors import InputError
from eagle_trt.interop import formats
from eagle_trt.interop.export import export_head
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget

FORMATS = list(formats.FORMATS)
ATOL = 2e-4  # fp32 throughout; the reference sums in another order (plain matmuls, float64 norms)


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory):
    """The tiny target with a random head over a reduced draft vocab (d2t: draft id i -> target id 2i)."""
    tmp = tmp_path_factory.mktemp("interop")
    head = write_random_head(tmp / "head", seed=3, aux=(1, 3, 4), draft_vocab=64, scale=0.3)
    return convert_model(tiny_model_dir, tmp / "ckpt", head=head, progress=False, calibrate_kv=False).output_dir


@pytest.fixture(scope="module")
def features(ckpt):
    """(target, the residual stream [embeddings, output of layer 0, ...], the sequence) for a fixed prompt."""
    target = LlamaTarget.load(ckpt / "target")
    ids = torch.tensor([256, 5, 77, 130, 9, 200, 31, 64, 18, 99, 3, 250])
    n = target.spec.num_layers
    _, outs = target.forward(ids, torch.arange(ids.numel()), target.new_cache(64), need_aux=True,
                             aux_layers=list(range(n)))
    return target, [target.embed[ids]] + list(outs.split(target.spec.hidden_size, dim=-1)), ids


def ours(ckpt, target, stream, ids, prenorm: bool):
    """eagle-trt's runtime head on the features it reads (outputs of its layer ids), with the given computation."""
    head = Eagle3DraftHead.load(ckpt / "draft", target)
    head.hidden_prenorm = prenorm
    aux = torch.cat([stream[i + 1] for i in head.spec.aux_layer_ids], -1)[:-1]
    t = ids.numel() - 1
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    logits, _ = head.forward(head.fuse(aux), ids[1:], torch.arange(t), head.new_cache(64), start=0, mask=causal)
    return logits, head.draft_to_target


def theirs(fmt, out, target, stream, ids):
    return REFERENCES[fmt](out, [s[:-1] for s in stream], ids[1:], torch.arange(ids.numel() - 1), target.embed)


@pytest.mark.parametrize("fmt", FORMATS)
def test_engine_reference_gives_our_logits(fmt, ckpt, features, tmp_path):
    target, stream, ids = features
    note = export_head(ckpt, fmt, tmp_path / fmt)
    engine = formats.FORMATS[fmt]
    got, got_ids = theirs(fmt, tmp_path / fmt, target, stream, ids)
    want, want_ids = ours(ckpt, target, stream, ids, prenorm=engine.double_norm)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
    exact, _ = ours(ckpt, target, stream, ids, prenorm=True)
    assert note["exact"] == engine.double_norm
    if engine.double_norm:
        torch.testing.assert_close(got, exact, atol=ATOL, rtol=1e-4)
    else:  # "not exact" is real: the engine's logits are not the ones eagle-trt trained the head to give
        assert (got - exact).abs().max() > 100 * ATOL
        assert note["cost"] and engine.engine in note["cost"]


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_unshifted_layer_ids_are_caught(fmt, ckpt, features, tmp_path, monkeypatch):
    """The mutation the reference tests exist for: ids written in eagle-trt's meaning feed other layers there. (SGLang
    reads ids that start at 1 as modelopt's, so unshifted ids happen to land right there; export refuses the one
    case that rule gets wrong, test_sglang_refuses_a_layer_0_head.)"""
    target, stream, ids = features
    monkeypatch.setattr(formats.Format, "engine_ids", lambda self, ours: list(ours))
    export_head(ckpt, fmt, tmp_path / fmt)
    got, _ = theirs(fmt, tmp_path / fmt, target, stream, ids)
    want, _ = ours(ckpt, target, stream, ids, prenorm=False)
    assert (got - want).abs().max() > 100 * ATOL


def test_sglang_ids_that_do_not_start_at_1(tiny_model_dir, features, tmp_path, monkeypatch):
    """A head whose first layer is not 1 gets SGLang's capture-before-layer ids (its reading since PR #25454), and the
    unshifted-ids mutation is caught there too."""
    target, stream, ids = features
    head = write_random_head(tmp_path / "head", seed=6, aux=(2, 3, 5), draft_vocab=64, scale=0.3)
    ckpt = convert_model(tiny_model_dir, tmp_path / "ckpt", head=head, progress=False, calibrate_kv=False).output_dir
    assert export_head(ckpt, "sglang", tmp_path / "s")["engine_aux_layer_ids"] == [3, 4, 6]
    got, _ = theirs("sglang", tmp_path / "s", target, stream, ids)
    want, _ = ours(ckpt, target, stream, ids, prenorm=False)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
    monkeypatch.setattr(formats.Format, "engine_ids", lambda self, ours: list(ours))
    export_head(ckpt, "sglang", tmp_path / "m")
    got, _ = theirs("sglang", tmp_path / "m", target, stream, ids)
    assert (got - want).abs().max() > 100 * ATOL


def test_sglang_refuses_a_layer_0_head(tiny_model_dir, tmp_path):
    head = write_random_head(tmp_path / "head", seed=5, aux=(0, 3, 4), draft_vocab=64)
    ckpt = convert_model(tiny_model_dir, tmp_path / "ckpt", head=head, progress=False, calibrate_kv=False).output_dir
    with pytest.raises(InputError, match="layer 0's output"):
        export_head(ckpt, "sglang", tmp_path / "s")
    export_head(ckpt, "vllm", tmp_path / "v")  # vLLM's id 1 is layer 0's output: fine there


def test_sglang_reference_refuses_layers0_names(ckpt, features, tmp_path):
    target, stream, ids = features
    export_head(ckpt, "vllm", tmp_path / "v")
    with pytest.raises(AssertionError, match="random weights"):
        theirs("sglang", tmp_path / "v", target, stream, ids)


def test_export_layouts(ckpt, tmp_path):
    from safetensors import safe_open

    layers = 8
    for fmt in FORMATS:
        note = export_head(ckpt, fmt, tmp_path / fmt)
        cfg = json.loads((tmp_path / fmt / "config.json").read_text())
        with safe_open(str(tmp_path / fmt / "model.safetensors"), "pt") as fh:
            names = set(fh.keys())
        prefix = formats.FORMATS[fmt].layer_prefix
        assert any(n.startswith(prefix) for n in names) and not any(
            n.startswith("layers.0." if prefix == "midlayer." else "midlayer.") for n in names)
        assert ("t2d" in names) == formats.FORMATS[fmt].writes_t2d
        assert note["aux_layer_ids"] == [1, 3, 4] and note["target"]["num_hidden_layers"] == layers
        # SGLang: ids starting at 1 stay in modelopt's convention (it adds 1 to those itself)
        want = [2, 4, 5] if formats.FORMATS[fmt].id_meaning == formats.BEFORE and fmt != "sglang" else [1, 3, 4]
        assert cfg["eagle_aux_hidden_state_layer_ids"] == want == note["engine_aux_layer_ids"]
        if fmt == "speculators":
            assert cfg["speculators_model_type"] == "eagle3" and cfg["norm_before_residual"] is False
            assert cfg["transformer_layer_config"]["hidden_size"] == 64 and cfg["draft_vocab_size"] == 64
        if fmt == "vllm":
            assert cfg["norm_before_residual"] is False
            assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == want


def test_full_vocab_head_gets_the_targets_lm_head(tiny_model_dir, tmp_path):
    head = write_random_head(tmp_path / "head", seed=4)
    ckpt = convert_model(tiny_model_dir, tmp_path / "ckpt", head=head, progress=False, calibrate_kv=False).output_dir
    note = export_head(ckpt, "vllm", tmp_path / "v")
    from safetensors.torch import load_file

    w = load_file(str(tmp_path / "v" / "model.safetensors"))
    target = load_file(str(ckpt / "target" / "model.safetensors"))
    assert note["lm_head_from_target"] and torch.equal(w["lm_head.weight"], target["lm_head.weight"])
    with pytest.raises(InputError, match="reuses the target's lm_head"):
        export_head(ckpt / "draft", "vllm", tmp_path / "w")


def test_export_cli(ckpt, tmp_path):
    r = CliRunner().invoke(app, ["export", str(ckpt), "--format", "vllm", "--output", str(tmp_path / "v"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["engine_aux_layer_ids"] == [2, 4, 5]
    assert json.loads(r.stdout)["target"]["name"] == json.loads((ckpt / "convert.json").read_text())["source"]["path"]
    r = CliRunner().invoke(app, ["export", str(ckpt), "--format", "speculators", "--output", str(tmp_path / "s"),
                                 "--target", "org/tiny-llama"])
    assert r.exit_code == 0, r.output
    spec = json.loads((tmp_path / "s" / "config.json").read_text())["speculators_config"]
    assert spec["verifier"] == {"name_or_path": "org/tiny-llama", "architectures": ["LlamaForCausalLM"]}
    r = CliRunner().invoke(app, ["export", str(ckpt), "--format", "onnx", "--output", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--format 'onnx'" in r.output
    r = CliRunner().invoke(app, ["export", str(ckpt), "--format", "vllm", "--output", str(tmp_path / "v")])
    assert r.exit_code == 2 and "--force" in r.output
    r = CliRunner().invoke(app, ["export", str(tmp_path / "v"), "--format", "vllm", "--output", str(tmp_path / "v"),
                                 "--force"])
    assert r.exit_code == 2 and "the head being exported" in r.output and (tmp_path / "v" / "eagle_trt.json").is_file()
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(app, ["export", str(tmp_path / "empty"), "--format", "vllm", "--output", str(tmp_path / "y")])
    assert r.exit_code == 2 and "not a checkpoint" in r.output


def test_export_refuses_a_trtllm_bundle(ckpt, tmp_path):
    import shutil

    bundle = tmp_path / "bundle"
    shutil.copytree(ckpt, bundle)
    (bundle / "trtllm.json").write_text("{}")
    with pytest.raises(InputError, match="TensorRT-LLM bundle"):
        export_head(bundle, "vllm", tmp_path / "v")


def test_export_measures_tau_on_an_engine(ckpt, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: tiny\ncheckpoint_dir: {ckpt}\nmax_input_len: 512\nmax_output_len: 128\n")
    r = CliRunner().invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "engine")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["export", str(tmp_path / "engine"), "--format", "vllm", "--output",
                                 str(tmp_path / "v"), "--measure-tau", "2", "--json"])
    assert r.exit_code == 0, r.output
    tau = json.loads(r.stdout)["tau"]
    assert set(tau) == {"prompts", "eagle-trt", "vLLM"}
    assert all(1.0 <= tau[k][t] <= 7.0 for k in ("eagle-trt", "vLLM") for t in ("chain", "dynamic"))
    assert json.loads((tmp_path / "v" / "eagle_trt.json").read_text())["tau"] == tau
    r = CliRunner().invoke(app, ["export", str(ckpt), "--format", "vllm", "--output", str(tmp_path / "w"),
                                 "--measure-tau", "2"])
    assert r.exit_code == 2 and "not an engine" in r.output
