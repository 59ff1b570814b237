"""eagle_config.yaml schema + loader: defaults, exact error lines, YAML round trip. No disk besides tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_trt.config import (
    EagleConfig,
    describe_fields,
    dump_config,
    load_config,
    override_config,
    parse_config,
)
from eagle_trt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = """\
eagle_architecture:
  hidden_size: 576
  num_attention_heads: 9
  intermediate_size: 1536
  num_hidden_layers: 1
  max_position_embeddings: 8192
draft_length: 6
confidence_threshold: 0.0
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value).replace(str(path), "cfg.yaml")


def test_template_only_yaml_gets_defaults(tmp_path):
    cfg = load_config(write(tmp_path, TEMPLATE))
    assert cfg.eagle_architecture.hidden_size == 576
    assert cfg.eagle_architecture.num_attention_heads == 9
    assert (cfg.name, cfg.backend, cfg.dtype, cfg.kv_cache_dtype) == ("smollm2-135m-eagle3", "torch", "auto", "auto")
    assert (cfg.draft_length, cfg.total_tokens, cfg.beam_width, cfg.tree) == (6, 32, 8, "dynamic")

    assert cfg.checkpoint_dir is None and cfg.static_tree is None
    # build settles dtype auto by what this machine runs fast; the KV cache follows it
    assert [cfg.with_dtype(lambda f=fast: f).resolved_kv_cache_dtype for fast in (True, False)] == ["bfloat16", "float32"]
    trt = cfg.model_copy(update={"backend": "trtllm"})
    assert trt.with_dtype(lambda: pytest.fail("asked for TensorRT-LLM")).dtype == "bfloat16"
    assert cfg.model_copy(update={"dtype": "float32"}).with_dtype(lambda: True).dtype == "float32"


def test_the_old_name_of_beam_width_still_reads(tmp_path):
    assert load_config(write(tmp_path, "max_beam_width: 4\ntotal_tokens: 16\n")).beam_width == 4


def test_shipped_config_is_smollm2():
    cfg = load_config(REPO / "configs" / "eagle_config.yaml")
    arch = cfg.eagle_architecture
    assert (arch.hidden_size, arch.num_attention_heads, arch.intermediate_size) == (576, 9, 1536)
    assert (arch.num_hidden_layers, arch.max_position_embeddings) == (1, 8192)
    assert cfg.checkpoint_dir == "checkpoints/smollm2-135m-instruct"


def test_empty_file_is_all_defaults(tmp_path):
    assert load_config(write(tmp_path, "# nothing\n")) == EagleConfig()


def test_unknown_key(tmp_path):
    assert error_of(tmp_path, "draft_lenght: 4\n") == (
        "cfg.yaml: draft_lenght: unknown field; valid fields: tree, draft_length, beam_width, total_tokens, "
        "confidence_threshold, static_tree, lookup_tokens, lookup_branches, datastore_branches, max_verify_rows, "
        "adaptive_lookup, name, checkpoint_dir, backend, trtllm_version, dtype, weights, block_compute, draft_weights, "
        "kv_cache_dtype, "
        "draft, eagle_architecture, max_batch_size, max_input_len, max_output_len, tensor_parallel_size, "
        "pipeline_parallel_size"
    )


def test_unknown_nested_key(tmp_path):
    text = TEMPLATE.replace("  num_hidden_layers: 1\n", "  num_hidden_layers: 1\n  num_kv_heads: 3\n")
    assert error_of(tmp_path, text) == (
        "cfg.yaml: eagle_architecture.num_kv_heads: unknown field; valid fields: hidden_size, "
        "num_attention_heads, intermediate_size, num_hidden_layers, max_position_embeddings"
    )


def test_negative_values_one_line_each(tmp_path):
    text = TEMPLATE.replace("hidden_size: 576", "hidden_size: -576") + "max_output_len: -1\n"
    assert error_of(tmp_path, text).splitlines() == [
        "cfg.yaml: eagle_architecture.hidden_size: Input should be greater than 0 (got -576)",
        "cfg.yaml: max_output_len: Input should be greater than or equal to 1 (got -1)",
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("draft_length: 6\ntotal_tokens: 4\n", "cfg.yaml: total_tokens (4) must be >= draft_length (6)"),
        ("total_tokens: 8\nbeam_width: 10\n", "cfg.yaml: beam_width (10) must be <= total_tokens (8)"),
        ("static_tree: [[0]]\n", "cfg.yaml: static_tree is set but tree is 'dynamic'; set tree: static or remove static_tree"),
        ("tree: static\n", "cfg.yaml: tree is 'static' but static_tree is empty or missing"),
        ("tree: static\nstatic_tree: [[0], [1, 0]]\n", "cfg.yaml: static_tree[1] [1, 0] needs its prefix [1] in static_tree"),
        ("tree: static\nstatic_tree: [[0], [-1]]\n", "cfg.yaml: static_tree[1][0]: Input should be greater than or equal to 0 (got -1)"),
        ("draft_length: '6'\n", "cfg.yaml: draft_length: Input should be a valid integer (got '6')"),
        ("dtype: fp16\n", "cfg.yaml: dtype: Input should be 'auto', 'float32', 'float16' or 'bfloat16' (got 'fp16')"),
        ("confidence_threshold: 1\n", "cfg.yaml: confidence_threshold: Input should be less than 1 (got 1)"),
        ("eagle_architecture: {hidden_size: 64}\n", None),
    ],
)
def test_field_and_cross_field_errors(tmp_path, text, expected):
    message = error_of(tmp_path, text)
    if expected is None:  # four missing nested fields, one line each
        assert message.splitlines()[0] == "cfg.yaml: eagle_architecture.num_attention_heads: required field is missing"
        assert len(message.splitlines()) == 4
    else:
        assert message == expected


def test_fp8_kv_cache_on_either_backend(tmp_path):
    # The torch runtime stores float8_e4m3fn with per-layer scales, so fp8 no longer needs trtllm.
    for backend in ("torch", "trtllm"):
        cfg = load_config(write(tmp_path, f"kv_cache_dtype: fp8\nbackend: {backend}\n"))
        assert cfg.resolved_kv_cache_dtype == "fp8"


def test_weights_default_to_a_gguf_s_own_blocks_and_to_float_for_trtllm(tmp_path):
    """weights / draft_weights default to auto (a GGUF keeps its blocks, a float checkpoint stays float); for
    backend trtllm auto is float, and a quantizing format is refused there."""
    cfg = load_config(write(tmp_path, "name: x\n"))
    assert (cfg.weights, cfg.draft_weights) == ("auto", "auto")
    assert (cfg.resolved_weights, cfg.resolved_draft_weights) == ("auto", "auto")
    trt = load_config(write(tmp_path, "backend: trtllm\n"))
    assert (trt.resolved_weights, trt.resolved_draft_weights) == ("float", "float")
    told = load_config(write(tmp_path, "weights: float\ndraft_weights: q8_0\n"))
    assert (told.resolved_weights, told.resolved_draft_weights) == ("float", "q8_0")
    assert "draft_weights q8_0 is for backend torch" in error_of(tmp_path, "backend: trtllm\ndraft_weights: q8_0\n")
    assert "weights q4_k is for backend torch" in error_of(tmp_path, "backend: trtllm\nweights: q4_k\n")


def test_static_tree_accepted(tmp_path):
    cfg = load_config(write(tmp_path, "tree: static\nstatic_tree: [[0], [1], [0, 0], [0, 1]]\n"))
    assert cfg.static_tree == [[0], [1], [0, 0], [0, 1]]


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "draft_length: 6\neagle_architecture: [1, 2\nname: x\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"config file '{path}' is not valid YAML (line 3, column 5): ")


def test_duplicate_key_is_an_error(tmp_path):
    assert error_of(tmp_path, "draft_length: 6\nname: x\ndraft_length: 4\n") == (
        "config file 'cfg.yaml' is not valid YAML (line 3, column 1): duplicate key 'draft_length'"
    )


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert str(info.value) == f"config file '{tmp_path / 'nope.yaml'}' not found"
    assert info.value.exit_code == 2


def test_top_level_must_be_mapping(tmp_path):
    assert error_of(tmp_path, "- draft_length\n") == (
        "cfg.yaml: the top level must be a mapping of field: value (got list)"
    )


def test_dump_round_trips(tmp_path):
    cfg = parse_config({"tree": "static", "static_tree": [[0], [0, 0]], "name": "x", "dtype": "float16"})
    assert load_config(write(tmp_path, dump_config(cfg))) == cfg


def test_override_revalidates():
    cfg = EagleConfig()
    new = override_config(
        cfg, {"draft_length": 4, "eagle_architecture.hidden_size": None, "dtype": "float16", "checkpoint_dir": Path("c")}
    )
    assert (new.draft_length, new.dtype, new.checkpoint_dir, cfg.draft_length) == (4, "float16", "c", 6)
    with pytest.raises(ConfigError, match=r"^command line: total_tokens \(3\) must be >= draft_length \(4\)$"):
        override_config(new, {"total_tokens": 3})


def test_describe_fields_covers_nested_and_documents_everything():
    rows = {name: (type_, default, desc) for name, type_, default, desc in describe_fields()}
    assert rows["draft_length"] == ("int in [1, 32]", "6", "Draft tree depth (draft steps per iteration).")
    assert rows["eagle_architecture"][:2] == ("mapping | null", "null")
    assert rows["eagle_architecture.hidden_size"][:2] == ("int > 0", "required")
    assert rows["static_tree"][0] == "list[list[int]] | null"
    assert rows["draft"][:2] == ("mapping | null", "null")
    assert rows["draft.kind"][:2] == ("'eagle3' | 'model'", "required")
    assert len(rows) == len(EagleConfig.model_fields) + 5 + 1  # eagle_architecture's five, draft's kind
    assert all(desc for _, _, desc in rows.values())


def _alias_bomb(levels: int = 10, width: int = 9) -> str:
    lines = ["name: bomb", "static_tree:", "  - &a0 [0]"]
    for i in range(1, levels):
        lines.append(f"  - &a{i} [" + ", ".join(f"*a{i - 1}" for _ in range(width)) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_fast(tmp_path):
    """10 anchors, each a list of 9 aliases of the previous: 5 KB of text, 9^9 values. config check hung (killed at
    300 s, 4 GB) before; now a one-line error, well within a second."""
    import time

    path = write(tmp_path, _alias_bomb())
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"expands to more than 100,000 values \(YAML anchors and aliases\)"):
        load_config(path)
    assert time.monotonic() - start < 5


def test_a_small_alias_is_fine_and_a_self_alias_is_refused(tmp_path):
    cfg = load_config(write(tmp_path, "tree: static\nstatic_tree: [&p [0], [0, 0], [1], [1, 0]]\n"
                                      "max_input_len: &n 64\nmax_output_len: *n\n"))
    assert cfg.static_tree == [[0], [0, 0], [1], [1, 0]]
    with pytest.raises(ConfigError, match="expands to more than"):
        load_config(write(tmp_path, "static_tree: &a [[0], *a]\n"))


def test_deep_nesting_is_a_clear_error(tmp_path):
    path = write(tmp_path, "static_tree: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="is nested more than 32 levels deep"):
        load_config(path)


def test_a_device_is_not_a_config(tmp_path):
    with pytest.raises(ConfigError, match=r"^config file '/dev/null' is not a regular file"):
        load_config("/dev/null")
