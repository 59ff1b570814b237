"""Property-based tests of the parsers of untrusted input: the YAML config, safetensors headers and shard indexes, the
weight cache's own layout files, manifest.json, GGUF files and JSONL prompt files.

The invariant for each: a correct result, or the project's own error for bad input (an InputError: exit 2, a message
naming the file), never another exception (a traceback), a hang or a write outside the output. Each property runs a
bounded number of generated inputs (`EXAMPLES`, plus hypothesis's shrinking of any failure) within a deadline; the
generators are seeded from structured valid inputs and then broken, so they reach past the first parse.
"""

from __future__ import annotations

import json
import os
import string
import struct

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle_trt.errors import InputError

EXAMPLES = int(os.environ.get("EAGLE_TRT_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12))
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                           st.dictionaries(st.text(max_size=8), kids, max_size=5)),
                           max_leaves=25)


def _written(tmp_path_factory, name: str, data: bytes):
    d = tmp_path_factory.mktemp("fuzz")
    path = d / name
    path.write_bytes(data)
    return d, path


def _nothing_else_written(d, expected: set[str]) -> None:
    assert {p.name for p in d.iterdir()} <= expected


# ---- the YAML config -------------------------------------------------------------------------------------------

from eagle_trt.config import load_config  # noqa: E402
from eagle_trt.config.schema import EagleConfig  # noqa: E402

FIELDS = list(EagleConfig.model_fields)
config_values = st.one_of(scalars, st.lists(st.lists(st.integers(-3, 9), max_size=4), max_size=6),
                          st.dictionaries(st.sampled_from(["hidden_size", "num_attention_heads", "x"]), scalars,
                                          max_size=3))
yaml_docs = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS + ["bogus"]), config_values, max_size=6).map(
        lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.text(alphabet=string.printable + "&*[]{}:-|>!%@`'\"", max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")),
)


@FUZZ
@given(text=yaml_docs)
def test_config_files(tmp_path_factory, text):
    d, path = _written(tmp_path_factory, "cfg.yaml", text.encode("utf-8", "surrogatepass"))
    try:
        cfg = load_config(path)
    except InputError as e:
        assert e.exit_code == 2 and str(e).strip()
    else:
        assert isinstance(cfg, EagleConfig)
    _nothing_else_written(d, {"cfg.yaml"})


@FUZZ
@given(depth=st.integers(1, 200_000), kind=st.sampled_from(["[", "{a: ", "- "]))
def test_config_nesting(tmp_path_factory, depth, kind):
    close = {"[": "]", "{a: ": "}", "- ": ""}[kind]
    text = "static_tree: " + kind * depth + "0" + close * depth + "\n" if kind != "- " else \
        "static_tree:\n" + "".join("  " * i + "- \n" for i in range(min(depth, 2000)))
    _, path = _written(tmp_path_factory, "cfg.yaml", text.encode())
    try:
        load_config(path)
    except InputError as e:
        assert e.exit_code == 2


# ---- safetensors headers and shard indexes --------------------------------------------------------------------

from eagle_trt.safetensors_stream import read_entries, read_tensor, tensor_locations  # noqa: E402
from eagle_trt.shards import index_weight_map  # noqa: E402

entry = st.fixed_dictionaries({}, optional={
    "dtype": st.one_of(st.sampled_from(["F32", "BF16", "I64", "BOOL", "F8_E4M3", "Q4"]), scalars),
    "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), scalars),
    "data_offsets": st.one_of(st.lists(st.integers(-8, 200), min_size=0, max_size=3), scalars)})
headers = st.one_of(st.dictionaries(st.text(max_size=6), st.one_of(entry, scalars), max_size=4), json_values)


@FUZZ
@given(header=headers, tail=st.binary(max_size=160), length_delta=st.integers(-20, 20))
def test_safetensors_headers(tmp_path_factory, header, tail, length_delta):
    blob = json.dumps(header).encode()
    n = max(0, len(blob) + (length_delta if length_delta % 3 == 0 else 0))
    _, path = _written(tmp_path_factory, "model.safetensors", struct.pack("<Q", n) + blob + tail)
    try:
        entries = read_entries(path)
    except InputError:
        return
    with open(path, "rb") as f:
        for e in entries.values():
            try:
                t = read_tensor(f, e)
            except InputError:
                continue
            assert tuple(t.shape) == e.shape


@FUZZ
@given(data=st.binary(max_size=64))
def test_safetensors_bytes(tmp_path_factory, data):
    _, path = _written(tmp_path_factory, "model.safetensors", data)
    try:
        read_entries(path)
    except InputError:
        pass


@FUZZ
@given(index=st.one_of(json_values, st.fixed_dictionaries({"weight_map": st.dictionaries(
    st.text(max_size=6), st.one_of(st.sampled_from(["a.safetensors", "b.safetensors", "../x.safetensors",
                                                     "/etc/passwd", "c.bin", ""]), scalars), max_size=4)})))
def test_shard_indexes(tmp_path_factory, index):
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("fuzz")
    save_file({"w": torch.zeros(2)}, str(d / "a.safetensors"))
    save_file({"w": torch.ones(2), "v": torch.zeros(1)}, str(d / "b.safetensors"))
    path = d / "model.safetensors.index.json"
    path.write_text(json.dumps(index))
    try:
        mapped = index_weight_map(path)
        where = tensor_locations(sorted({d / n for n in mapped.values()}), path)
    except InputError:
        return
    for name, (shard, _) in where.items():
        assert mapped.get(name, shard.name) == shard.name and shard.parent == d


def damaged(good: bytes, edits: list[tuple[int, bytes]], cut: int | None) -> bytes:
    """`good` with each (offset, bytes) written over it (offsets wrap around), then cut to `cut` bytes."""
    data = bytearray(good)
    for at, chunk in edits:
        at %= len(data)
        data[at:at + len(chunk)] = chunk
    return bytes(data if cut is None else data[:cut])


# ---- the weight cache's layout files --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """A valid layout file's bytes (signed with a cache key made for this module's cache dir)."""
    from eagle_trt.models import weight_cache

    root = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("EAGLE_TRT_WEIGHT_CACHE", str(root))
    path = weight_cache.layouts_dir() / ("target-" + "a" * 32 + ".etw")
    weight_cache.write(path, {"a": torch.arange(12.0).view(3, 4), "b": torch.ones(5, dtype=torch.bfloat16)},
                       {"projections": {}, "num_layers": 1})
    yield path, path.read_bytes()
    mp.undo()


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 2000), st.binary(min_size=1, max_size=8)), max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 2000)))
def test_layout_files(layout, edits, cut):
    """Any damage to a layout (header, MAC, data, length) is a miss: None, never an exception; an undamaged one
    reads back."""
    from eagle_trt.models import weight_cache

    path, good = layout
    data = damaged(good, edits, cut)
    path.write_bytes(data)
    got = weight_cache.read(path)
    if data == good:
        assert got is not None and torch.equal(got[0]["a"], torch.arange(12.0).view(3, 4))
    elif got is not None:  # only a change the checksum and MAC cannot see (none: they cover every byte)
        pytest.fail(f"a damaged layout was read: {edits} {cut}")
    path.write_bytes(good)


# ---- manifest.json ---------------------------------------------------------------------------------------------

from eagle_trt.engine.manifest import read_manifest  # noqa: E402

manifests = st.one_of(json_values, st.fixed_dictionaries({"format_version": st.one_of(st.integers(-1, 3), scalars),
                                                          "files": st.dictionaries(st.text(max_size=10), json_values,
                                                                                   max_size=3)}))


@FUZZ
@given(doc=manifests, raw=st.one_of(st.none(), st.binary(max_size=80)))
def test_manifests(tmp_path_factory, doc, raw):
    d, path = _written(tmp_path_factory, "manifest.json", raw if raw is not None else json.dumps(doc).encode())
    try:
        read_manifest(d)
    except InputError:
        pass
    _nothing_else_written(d, {"manifest.json"})


@pytest.mark.parametrize("depth", [10, 10_000, 200_000])
def test_a_deeply_nested_manifest_is_an_error(tmp_path, depth):
    (tmp_path / "manifest.json").write_text("[" * depth + "]" * depth)
    with pytest.raises(InputError):
        read_manifest(tmp_path)


# ---- GGUF files ------------------------------------------------------------------------------------------------

def _gguf_bytes() -> bytes:
    """A small valid GGUF (written with the gguf package): metadata and two tensors."""
    import tempfile

    import gguf
    import numpy as np

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_string("general.name", "fuzz")
        w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
        w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return open(path, "rb").read()


@pytest.fixture(scope="module")
def gguf_file():
    return _gguf_bytes()


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=5000, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=8)), max_size=3),
       cut=st.one_of(st.none(), st.integers(0, 600)))
def test_gguf_files(tmp_path_factory, gguf_file, edits, cut):
    from eagle_trt.convert.load_target import _check_gguf

    _, path = _written(tmp_path_factory, "m.gguf", damaged(gguf_file, edits, cut))
    try:
        _check_gguf(path)
    except InputError:
        pass


# ---- JSONL prompt files ----------------------------------------------------------------------------------------

from eagle_trt.bench.prompts import load_prompts  # noqa: E402

rows = st.one_of(
    st.fixed_dictionaries({}, optional={"prompt": scalars, "messages": st.one_of(json_values, st.lists(
        st.fixed_dictionaries({}, optional={"role": st.one_of(st.sampled_from(["user", "assistant", "wizard"]),
                                                              scalars), "content": scalars}), max_size=3)),
        "id": scalars, "chat": scalars, "category": scalars}),
    json_values)


@FUZZ
@given(lines=st.lists(st.one_of(rows.map(json.dumps), st.text(max_size=30)), max_size=5))
def test_prompt_files(tmp_path_factory, lines):
    d, path = _written(tmp_path_factory, "p.jsonl", "\n".join(lines).encode("utf-8", "surrogatepass"))
    try:
        prompts = load_prompts(str(path))
    except InputError:
        return
    assert prompts and all(p.messages or p.text.strip() for p in prompts)
    _nothing_else_written(d, {"p.jsonl"})
