"""`convert --head` on heads in every engine's layout: detected from config and names, checked against the target,
and the round trip export -> import gives back the same tensors, the same greedy output and the same tau."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_random_head
from safetensors.torch import load_file, save_file

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.convert import convert_model
from eagle_trt.errors import CheckpointError, InputError
from eagle_trt.interop import formats
from eagle_trt.interop.export import export_head
from eagle_trt.interop.import_head import load_head
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.runtime.runner import Runner

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "heads" / "smollm2-135m-instruct"
TINY_TARGET = {"hidden_size": 64, "vocab_size": 260, "num_hidden_layers": 8}


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interop-import")
    head = write_random_head(tmp / "head", seed=7, aux=(1, 3, 4), draft_vocab=64, scale=0.3)
    return convert_model(tiny_model_dir, tmp / "ckpt", head=head, progress=False, calibrate_kv=False).output_dir


def _decode(ckpt: Path, prompts):
    target = LlamaTarget.load(ckpt / "target")
    runner = Runner(target, Eagle3DraftHead.load(ckpt / "draft", target), capacity=256, budget=False)
    outs = [runner.generate(p, DecodeConfig(max_new_tokens=24, lookup_tokens=0)) for p in prompts]
    return [o.token_ids for o in outs], [round(o.metrics.acceptance_length, 6) for o in outs]


@pytest.mark.parametrize("fmt", list(formats.FORMATS))
def test_round_trip_tiny(fmt, ckpt, tiny_model_dir, tmp_path):
    export_head(ckpt, fmt, tmp_path / "exported")
    back = convert_model(tiny_model_dir, tmp_path / "back", head=tmp_path / "exported", progress=False,
                         calibrate_kv=False)
    assert back.summary["head_format"] == fmt
    a, b = load_file(str(ckpt / "draft" / "model.safetensors")), load_file(str(back.draft_dir / "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)  # eagle-trt's head keeps layers.0.* names
    cfg = json.loads((back.draft_dir / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    prompts = [[256, 5, 6, 7, 5, 6], [256, 40, 41, 42, 43]]
    assert _decode(ckpt, prompts) == _decode(back.output_dir, prompts)


def test_round_trip_demo_head(tmp_path):
    target = json.loads((DEMO / "config.json").read_text())
    target = {"hidden_size": target["hidden_size"], "vocab_size": target["vocab_size"],
              "num_hidden_layers": target["target_num_hidden_layers"]}
    orig = load_file(str(DEMO / "model.safetensors"))
    for fmt in formats.FORMATS:
        note = export_head(DEMO, fmt, tmp_path / fmt)
        assert note["aux_layer_ids"] == [1, 14, 26]
        assert note["engine_aux_layer_ids"] == ([2, 15, 27] if fmt in ("vllm", "speculators") else [1, 14, 26])
        got_fmt, head = load_head(tmp_path / fmt, target)
        assert got_fmt == fmt and head.hidden_prenorm and head.aux_ids == [1, 14, 26]
        assert set(head.tensors) == set(orig) and all(torch.equal(head.tensors[k], orig[k]) for k in orig)


def _foreign(tmp: Path, *, prefix="midlayer.", cfg_update=None, drop=(), extra=None) -> Path:
    """A head as another trainer publishes it: EAGLE's / SpecForge's midlayer.* names, no eagle-trt note."""
    src = write_random_head(tmp / "src", seed=9, aux=(1, 3, 4), draft_vocab=64)
    w = {(prefix + k[len("layers.0."):] if k.startswith("layers.0.") else k): t
         for k, t in load_file(str(src / "model.safetensors")).items()}
    w.update(extra or {})
    out = tmp / "foreign"
    out.mkdir()
    save_file(w, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("eagle_config")
    for key in drop:
        cfg.pop(key, None)
    cfg.update(cfg_update or {})
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_import_official_eagle_head_with_default_ids(tmp_path, tiny_model_dir):
    head = _foreign(tmp_path, drop=("eagle_aux_hidden_state_layer_ids",))
    fmt, h = load_head(head, TINY_TARGET)
    # no ids: the engines' default (2, L//2, L-3) before-layer = outputs of layers 1, 3, 4 of the 8-layer target
    assert fmt == "sglang" and h.aux_ids == [1, 3, 4] and not h.hidden_prenorm
    out = convert_model(tiny_model_dir, tmp_path / "ckpt", head=head, progress=False, calibrate_kv=False)
    names = load_file(str(out.draft_dir / "model.safetensors"))
    assert any(k.startswith("midlayer.") for k in names)  # the runtime computes it hidden_norm only
    target = LlamaTarget.load(out.output_dir / "target")
    assert not Eagle3DraftHead.load(out.draft_dir, target).hidden_prenorm


def _speculators_head(tmp_path, normed_residual: bool) -> Path:
    """A head as speculators saves it (Red Hat's heads are mostly norm_before_residual: true)."""
    t2d = torch.zeros(260, dtype=torch.bool)
    t2d[torch.arange(64) * 2] = True
    return _foreign(tmp_path, prefix="layers.0.", extra={"t2d": t2d}, cfg_update={
        "speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [2, 4, 6], "draft_vocab_size": 64,
        "norm_before_residual": normed_residual, "speculators_config": {"algorithm": "eagle3"},
        "transformer_layer_config": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                                     "head_dim": 16, "intermediate_size": 128, "rms_norm_eps": 1e-6,
                                     "rope_theta": 10000.0, "vocab_size": 260}})


def test_import_speculators_head(tmp_path):
    d2t = torch.arange(64, dtype=torch.long)
    head = _speculators_head(tmp_path, normed_residual=False)
    fmt, h = load_head(head, TINY_TARGET)
    assert fmt == "speculators" and h.aux_ids == [1, 3, 5] and "t2d" not in h.tensors
    assert torch.equal(h.tensors["d2t"], d2t)


@pytest.mark.parametrize("case, match", [
    (dict(prefix="layers.0."), "cannot tell a modelopt head"),
    (dict(cfg_update={"norm_before_fc": True}), "norm_before_fc is true"),
    (dict(cfg_update={"eagle_aux_hidden_state_layer_ids": [0, 3, 4]}), "embedding output"),
    (dict(cfg_update={"eagle_aux_hidden_state_layer_ids": [2, 4, 9]}), r"layers \[1, 3, 8\] of a 8-layer target"),
    (dict(cfg_update={"hidden_size": 32}), "hidden_size 32 does not match"),
    (dict(cfg_update={"eagle_aux_hidden_state_layer_ids": [2, 4]}), "fc.weight has shape"),
    (dict(cfg_update={"speculators_model_type": "mlp"}), "not an EAGLE-3 head"),
])
def test_import_errors_are_one_line(tmp_path, case, match):
    head = _foreign(tmp_path, **case)
    with pytest.raises(CheckpointError, match=match) as e:
        load_head(head, TINY_TARGET)
    assert "\n" not in str(e.value) and str(head) in str(e.value)


def test_norm_before_residual_head_runs_as_speculators_computes_it(tmp_path, tiny_model_dir):
    """A speculators head with norm_before_residual, imported: eagle-trt's runtime (its compiled kernels where they
    serve) gives the logits speculators' own layer gives on the original files; the flag travels out to vLLM again
    and is refused for an engine that would ignore it."""
    from interop_reference import REFERENCES

    head = _speculators_head(tmp_path, normed_residual=True)
    ckpt = convert_model(tiny_model_dir, tmp_path / "ckpt", head=head, progress=False, calibrate_kv=False).output_dir
    assert json.loads((ckpt / "draft" / "config.json").read_text())["norm_before_residual"] is True
    target = LlamaTarget.load(ckpt / "target")
    ids = torch.tensor([256, 5, 77, 130, 9, 200, 31, 64, 18, 99])
    _, outs = target.forward(ids, torch.arange(ids.numel()), target.new_cache(64), need_aux=True,
                             aux_layers=list(range(8)))
    stream = [target.embed[ids]] + list(outs.split(64, dim=-1))
    t = ids.numel() - 1
    draft = Eagle3DraftHead.load(ckpt / "draft", target)
    assert draft.normed_residual and not draft.hidden_prenorm
    aux = torch.cat([stream[i + 1] for i in draft.spec.aux_layer_ids], -1)[:-1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    ours, _ = draft.forward(draft.fuse(aux), ids[1:], torch.arange(t), draft.new_cache(64), 0, mask=causal)
    theirs, _ = REFERENCES["speculators"](head, [s[:-1] for s in stream], ids[1:], torch.arange(t), target.embed)
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)
    draft.normed_residual = False  # the mutation: the raw feature as the residual
    draft._weights = draft.kernels.draft_weights(draft)
    wrong, _ = draft.forward(draft.fuse(aux), ids[1:], torch.arange(t), draft.new_cache(64), 0, mask=causal)
    assert (wrong - theirs).abs().max() > 1e-2
    export_head(ckpt, "vllm", tmp_path / "v")
    assert json.loads((tmp_path / "v" / "config.json").read_text())["norm_before_residual"] is True
    with pytest.raises(InputError, match="norm_before_residual"):
        export_head(ckpt, "sglang", tmp_path / "s")
    from typer.testing import CliRunner

    from eagle_trt.cli.app import app

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: t\ncheckpoint_dir: {ckpt}\nmax_input_len: 64\nmax_output_len: 64\nbackend: trtllm\n")
    r = CliRunner().invoke(app, ["build", "--config", str(cfg), "--output", str(tmp_path / "engine")])
    assert r.exit_code == 2 and "TensorRT-LLM does not compute" in r.output and not (tmp_path / "engine").exists()


def test_import_refuses_an_eagle1_head(tmp_path):
    src = _foreign(tmp_path)
    w = {k: t for k, t in load_file(str(src / "model.safetensors")).items() if "hidden_norm" not in k}
    save_file(w, str(src / "model.safetensors"))
    with pytest.raises(CheckpointError, match="EAGLE-1/2 head"):
        load_head(src, TINY_TARGET)


def test_import_refuses_both_layouts(tmp_path):
    head = _foreign(tmp_path, extra={"layers.0.hidden_norm.weight": torch.ones(64)})
    with pytest.raises(CheckpointError, match="both midlayer"):
        load_head(head, TINY_TARGET)


def test_note_and_ids_must_agree(ckpt, tmp_path):
    export_head(ckpt, "vllm", tmp_path / "v")
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [3, 4, 5]
    (tmp_path / "v" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="eagle_trt.json says"):
        load_head(tmp_path / "v", TINY_TARGET)
    shutil.rmtree(tmp_path / "v")


def test_a_head_shipped_as_q8_0_rows(ckpt, tiny_model_dir, tmp_path):
    """export_head.py --q8-0: the projections as GGUF q8_0 rows (fewer bytes than fp16); convert --head reads them
    back de-quantized (gguf-py's values), the head drafts with the output of the same target unchanged, and q8_0
    of the de-quantized weights gives the shipped blocks again (a draft_weights: q8_0 build loses nothing more)."""
    import subprocess
    import sys

    from eagle_trt.interop.head_blocks import Q8_KEY, unpack_q8_0
    from eagle_trt.quant_encode import quantize_rows

    out = tmp_path / "q8head"
    subprocess.run([sys.executable, str(REPO / "scripts" / "export_head.py"), str(ckpt), str(out), "--q8-0"],
                   check=True, capture_output=True)
    shipped = load_file(str(out / "model.safetensors"))
    packed = [k for k, t in shipped.items() if t.dtype == torch.uint8]
    assert "lm_head.weight" in packed and "fc.weight" in packed
    fp32 = load_file(str(ckpt / "draft" / "model.safetensors"))
    back = convert_model(tiny_model_dir, tmp_path / "back", head=out, progress=False, calibrate_kv=False)
    got = load_file(str(back.draft_dir / "model.safetensors"))
    assert set(got) == set(fp32)
    for k in packed:
        assert got[k].dtype == torch.float32 and got[k].shape == fp32[k].shape
        assert torch.equal(quantize_rows(got[k], "q8_0").data, shipped[k])  # requantizing: the same blocks
        assert (got[k] - fp32[k]).abs().max() <= fp32[k].abs().max() / 127  # within a code of the fp32 head
    tokens, tau = _decode(back.output_dir, [[256, 5, 6, 7, 5, 6]])
    assert tokens == _decode(ckpt, [[256, 5, 6, 7, 5, 6]])[0] and tau[0] >= 1.0
    with pytest.raises(CheckpointError, match="names tensor 'missing'"):
        unpack_q8_0({}, {Q8_KEY: '{"missing": [2, 32]}'})
    with pytest.raises(CheckpointError, match="not a JSON object"):
        unpack_q8_0({}, {Q8_KEY: "[1, 2]"})
