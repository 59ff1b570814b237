"""A served trtllm bundle on several GPUs: tensor / pipeline parallel sizes and the batch, within the line's fields."""

from __future__ import annotations

import json

import pytest
import yaml

from eagle_trt.engine import build_engine
from eagle_trt.errors import ConfigError
from trtllm_fakes import SCHEMA, check_types, contract_violations, tiny_trtllm_checkpoint, trt_cfg


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory):
    return tiny_trtllm_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("par") / "ckpt")


@pytest.mark.parametrize("line", ["1.2", "1.3+"])
def test_parallel_sizes_and_batch_reach_the_yaml_within_the_line(ckpt, tmp_path, line):
    cfg = trt_cfg(trtllm_version=line, tensor_parallel_size=2, pipeline_parallel_size=4, max_batch_size=32)
    summary = build_engine(cfg, ckpt, tmp_path / "e")
    doc = yaml.safe_load((summary.engine_dir / "extra_llm_api_options.yaml").read_text())
    assert (doc["tensor_parallel_size"], doc["pipeline_parallel_size"], doc["max_batch_size"]) == (2, 4, 32)
    assert contract_violations(doc, line) == []
    check_types(doc, SCHEMA["llm_api"], "TorchLlmArgs")
    assert doc["max_num_tokens"] >= 32 * (doc["speculative_config"].get("max_total_draft_tokens", 4) + 1)
    meta = json.loads((summary.engine_dir / "trtllm.json").read_text())
    assert (meta["tensor_parallel_size"], meta["pipeline_parallel_size"]) == (2, 4)
    assert not [w for w in summary.warnings if "max_batch_size 1" in w]


def test_one_request_at_a_time_on_several_gpus_is_a_warning(ckpt, tmp_path):
    summary = build_engine(trt_cfg(tensor_parallel_size=2), ckpt, tmp_path / "e")
    assert ("2 GPUs (tensor 2 x pipeline 1) serving max_batch_size 1: one request at a time; raise max_batch_size "
            "for a served bundle (see docs/trtllm.md, Deploying on several GPUs)") in summary.warnings


@pytest.mark.parametrize("changes, message", [
    ({"tensor_parallel_size": 3}, "tensor_parallel_size 3 does not divide the target's num_attention_heads (4): "
                                  "use a divisor of 4"),
    ({"tensor_parallel_size": 8}, "tensor_parallel_size 8 does not divide the target's num_attention_heads (4)"),
    ({"pipeline_parallel_size": 9}, "pipeline_parallel_size 9 exceeds the target's 8 layers: each stage needs one"),
])  # fmt: skip
def test_splits_the_models_cannot_take_exit_2_before_anything_is_written(ckpt, tmp_path, changes, message):
    with pytest.raises(ConfigError) as err:
        build_engine(trt_cfg(**changes), ckpt, tmp_path / "e", dry_run=True)
    assert str(err.value).startswith(message)
    assert not (tmp_path / "e").exists()


def test_kv_heads_fewer_than_gpus_are_replicated_so_tp_4_fits(ckpt, tmp_path):
    # 4 query heads, 2 KV heads: TP 4 splits the queries and gives each KV head to two GPUs.
    build_engine(trt_cfg(tensor_parallel_size=4, max_batch_size=8), ckpt, tmp_path / "e", dry_run=True)


def test_the_torch_engine_runs_on_one_device(ckpt, tmp_path):
    with pytest.raises(ConfigError, match=r"^tensor_parallel_size 2 x pipeline_parallel_size 1: the torch engine runs "
                                          r"on one device; set both to 1, or build with --backend trtllm"):
        build_engine(trt_cfg(backend="torch", dtype="float32", tensor_parallel_size=2), ckpt, tmp_path / "e")


def test_the_bundle_carries_no_path_of_the_build_machine(ckpt, tmp_path):
    root = build_engine(trt_cfg(trtllm_version="1.2"), ckpt, tmp_path / "e").engine_dir
    cfg = yaml.safe_load((root / "eagle_config.yaml").read_text())
    assert cfg["checkpoint_dir"] is None
    leaked = [p.relative_to(root) for p in root.rglob("*") if p.is_file()
              and (str(ckpt).encode() in p.read_bytes() or str(tmp_path).encode() in p.read_bytes())]
    assert leaked == []


def test_the_legacy_engine_flow_gets_the_same_split(ckpt, tmp_path):
    from test_trtllm_legacy import eagle1_ckpt

    work = eagle1_ckpt(ckpt, tmp_path / "ckpt1")
    root = build_engine(trt_cfg(trtllm_version="1.2", total_tokens=12, tensor_parallel_size=2,
                                pipeline_parallel_size=2, max_batch_size=4), work, tmp_path / "e").engine_dir  # fmt: skip
    conf = json.loads((root / "legacy_trt" / "config.json").read_text())
    assert conf["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}
    script = (root / "legacy_trt" / "trtllm_build.sh").read_text()
    assert "--tp_size 2 --pp_size 2" in script  # examples/eagle/convert_checkpoint.py writes one shard per rank


def test_build_flags_set_the_split_and_a_bad_one_is_one_line(ckpt, tmp_path):
    from typer.testing import CliRunner

    from eagle_trt.cli.app import app

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(trt_cfg(max_batch_size=8).model_dump(mode="json")))
    base = ["build", "-c", str(cfg_path), "--checkpoint", str(ckpt), "-o", str(tmp_path / "e")]
    ok = CliRunner().invoke(app, base + ["--tp", "2", "--pp", "2"])
    assert ok.exit_code == 0, ok.output
    doc = yaml.safe_load((tmp_path / "e" / "extra_llm_api_options.yaml").read_text())
    assert (doc["tensor_parallel_size"], doc["pipeline_parallel_size"]) == (2, 2)
    bad = CliRunner().invoke(app, base + ["--tensor-parallel-size", "3", "--dry-run"])
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines()[0] == ("Error: tensor_parallel_size 3 does not divide the target's "
                                                  "num_attention_heads (4): use a divisor of 4")
