"""convert's --device: where regeneration, feature caching and training run (the CPU here; CUDA by contract)."""

import json

import pytest
import torch
from typer.testing import CliRunner

from eagle_trt.cli.app import app
from eagle_trt.convert.device import resolve_device, training_matmul
from eagle_trt.errors import InputError


def test_cpu_and_auto():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device(None).type == expected


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "cuda:-1", "gpu"])
def test_unknown_device_is_a_clear_error(bad):
    with pytest.raises(InputError, match="--device must be"):
        resolve_device(bad)


def test_empty_device_means_auto():
    assert resolve_device("") == resolve_device("auto")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_says_what_to_do(name):
    with pytest.raises(InputError, match="sees no CUDA GPU; use --device cpu"):
        resolve_device(name)


def test_training_matmul_turns_tf32_on_for_cuda_only_and_restores_it():
    # The flags are process-wide settings: no GPU is needed to check them.
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        with training_matmul(torch.device("cpu")):
            assert not torch.backends.cuda.matmul.allow_tf32
        with training_matmul(torch.device("cuda")):
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        with pytest.raises(RuntimeError), training_matmul(torch.device("cuda")):
            raise RuntimeError("a failed step")
        assert not torch.backends.cuda.matmul.allow_tf32  # restored on errors too
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_convert_cli_refuses_cuda_before_loading(tiny_model_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "response": "there"}) + "\n")
    out = tmp_path / "ck"
    r = CliRunner().invoke(app, ["convert", str(tiny_model_dir), "--output", str(out), "--steps", "1",
                                 "--data", str(data), "--device", "cuda"])
    assert r.exit_code != 0
    assert "--device cuda" in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_cache_batch_widens_the_stored_features_on_the_requested_device(tiny_model_dir, tmp_path):
    from eagle_trt.convert.data import build_dataset
    from eagle_trt.convert.load_target import load_target
    from eagle_trt.convert.train import build_feature_cache

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"the cat {i}", "response": "sat on the mat " * (i + 1)}) + "\n"
                            for i in range(6)))
    model, tok, _ = load_target(tiny_model_dir)
    ds = build_dataset([data], tok, seq_len=32, n_val=0, progress=False)
    cache = build_feature_cache(model, ds.sequences, [1, 3, 4], tmp_path / "cache", key="k", progress=False)
    batch = cache.batch([0, 2])
    n = cache.length(0)
    stored = cache.sequence(0)
    assert batch["aux"].dtype == batch["hidden"].dtype == torch.float32
    assert torch.equal(batch["aux"][0, :n], stored["aux"].float())
    assert torch.equal(batch["hidden"][0, :n], stored["hidden"].float())
    assert batch["attention_mask"][0, :n].all() and not batch["aux"][0, n:].any()
    # Another device (meta: shapes and dtypes without memory) gets every tensor, widened there.
    moved = cache.batch([0, 2], device="meta")
    for k, v in batch.items():
        assert moved[k].device.type == "meta" and moved[k].dtype == v.dtype and moved[k].shape == v.shape


def test_precision_names_and_auto():
    from eagle_trt.convert.device import resolve_precision
    from eagle_trt.models import isa

    cpu = torch.device("cpu")
    assert resolve_precision("float32", cpu) == torch.float32
    assert resolve_precision(" BFloat16 ", cpu) == torch.bfloat16
    # auto: bf16 where the CPU has AMX-BF16 tiles (several times fp32's speed there), fp32 elsewhere
    want = torch.bfloat16 if "amx_bf16" in isa.cpu_flags() else torch.float32
    assert resolve_precision("auto", cpu) == resolve_precision(None, cpu) == want
    with pytest.raises(InputError, match="--precision must be one of auto, float32, bfloat16"):
        resolve_precision("fp16", cpu)


def test_training_matmul_autocasts_bf16_only_when_asked():
    x = torch.randn(4, 8)
    w = torch.randn(8, 3)
    with training_matmul(torch.device("cpu")):
        assert (x @ w).dtype == torch.float32
    with training_matmul(torch.device("cpu"), torch.bfloat16):
        assert (x @ w).dtype == torch.bfloat16
    assert (x @ w).dtype == torch.float32  # left on the way out


def test_a_weight_updated_inside_the_bf16_context_is_read_anew():
    """The training loop runs inside one training_matmul context: a forward after an optimizer step must read the
    stepped weight, not a bf16 copy cached at the first forward."""
    lin = torch.nn.Linear(8, 3, bias=False)
    x = torch.randn(4, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    with training_matmul(torch.device("cpu"), torch.bfloat16):
        first = lin(x)
        first.float().pow(2).sum().backward()
        opt.step()
        second = lin(x)
        expected = (x.bfloat16() @ lin.weight.detach().bfloat16().t())
    assert not torch.equal(first, second)
    assert torch.equal(second, expected)


def test_convert_refuses_a_bad_precision_before_loading(tiny_model_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "response": "there"}) + "\n")
    r = CliRunner().invoke(app, ["convert", str(tiny_model_dir), "--output", str(tmp_path / "ck"), "--steps", "1",
                                 "--data", str(data), "--precision", "half"])
    assert r.exit_code == 2 and "--precision must be one of" in r.output
    assert not (tmp_path / "ck").exists()
