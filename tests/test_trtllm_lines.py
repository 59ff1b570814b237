"""Which TensorRT-LLM releases read which bundle line: the floors recorded in the contract fixtures."""

from __future__ import annotations

import pytest

from eagle_trt.engine import trtllm_backend
from eagle_trt.engine.trtllm_lines import (EAGLE3_FLOOR, LINES, TREE_FLOOR, accepted_releases, line_for,
                                           parse_release, refusal, release_text)
from trtllm_fakes import CONTRACTS


@pytest.mark.parametrize("version, line", [
    ("1.2.0rc7", "1.2"), ("1.2.0", "1.2"), ("1.2.1", "1.2"), ("1.2.1.post2", "1.2"), ("1.2.0rc8.post1", "1.2"),
    ("1.3.0rc0", "1.2"), ("1.3.0rc9", "1.2"), ("1.3.0rc9.post3", "1.2"),  # before the one-model dynamic tree
    ("1.3.0rc10", "1.3+"), ("1.3.0rc26.dev202609050001", "1.3+"), ("1.3.0rc27", "1.3+"), ("1.3.0", "1.3+"),
    ("1.4.0rc4", "1.3+"), ("1.3.0+cu130", "1.3+"), ("2.0.0", "1.3+"),
    ("1.2.0rc6", None), ("1.2.0rc6.post3", None), ("1.2.0rc0", None), ("1.1.0", None), ("0.21.0", None),
    ("?", None), (None, None), ("", None), ("1.2.0a1", None),
])  # fmt: skip
def test_each_release_maps_to_the_line_it_reads(version, line):
    found = line_for(version)
    assert (found.name if found else None) == line
    assert (refusal(version) is None) is (line is not None)


def test_pre_and_post_releases_order_like_their_release():
    assert parse_release("1.2.0rc6.post3") == parse_release("1.2.0rc6") < parse_release("1.2.0rc7")
    assert parse_release("1.2.0rc9") < parse_release("1.2.0rc10") < parse_release("1.2.0") < parse_release("1.2.1")
    assert parse_release("1.3.0rc27") < parse_release("1.3.0") < parse_release("1.4.0rc1")
    assert release_text(parse_release("1.3.0rc10.post1")) == "1.3.0rc10" and release_text(parse_release("1.2")) == "1.2.0"


def test_lines_cover_every_release_from_the_floor_without_overlap():
    spans = sorted(LINES.values(), key=lambda ln: ln.first)
    assert spans[0].first == EAGLE3_FLOOR and spans[-1].until is None
    for a, b in zip(spans, spans[1:]):
        assert a.until == b.first
    assert LINES["1.2"].until == TREE_FLOOR == LINES["1.3+"].first
    assert accepted_releases() == {"1.2": {"from": "1.2.0rc7", "before": "1.3.0rc10"},
                                   "1.3+": {"from": "1.3.0rc10", "before": None}}


def test_below_the_floor_the_reason_names_what_that_release_parses():
    assert refusal("1.2.0rc6.post3") == (
        "TensorRT-LLM 1.2.0rc6.post3 predates speculative_config.decoding_type Eagle3 and Draft_Target: its parser "
        "(DecodingBaseConfig.from_dict) takes only Eagle and DraftTarget for these drafters; install TensorRT-LLM "
        "1.2.0rc7 or newer")
    assert refusal("nightly").startswith("'nightly' is not a TensorRT-LLM release version")


def test_floors_are_the_ones_the_fixtures_record_with_their_sources():
    for name, contract in CONTRACTS.items():
        floors = contract["version_floors"]
        assert floors["eagle3_decoding_type"]["first_release"] == release_text(EAGLE3_FLOOR)
        assert floors["one_model_dynamic_tree"]["first_release"] == release_text(TREE_FLOOR)
        for floor in floors.values():
            assert floor["pull_request"].startswith("https://github.com/NVIDIA/TensorRT-LLM/pull/")
            assert floor["below"] and floor["read"]
        assert contract["accepted_releases"] == accepted_releases()[name]


def test_a_bundle_for_another_line_names_the_fix(tmp_path):
    (tmp_path / "trtllm.json").write_text('{"trtllm_version": "1.2"}')
    assert trtllm_backend.line_mismatch(tmp_path, "1.3.0rc9") is None  # a 1.3 rc before the tree reads 1.2
    assert "rebuild it with --trtllm-version 1.3+" in trtllm_backend.line_mismatch(tmp_path, "1.3.0rc10")
    assert trtllm_backend.line_mismatch(tmp_path, "1.2.0rc6.post3") == refusal("1.2.0rc6.post3")


def test_the_docs_state_the_floors_and_the_refusal_the_code_has():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "trtllm.md").read_text()
    assert f"| {release_text(EAGLE3_FLOOR)} | `decoding_type: Eagle3`" in doc
    assert f"| {release_text(TREE_FLOOR)} | the one-model dynamic tree" in doc
    assert f"`{refusal('1.2.0rc6.post3')}`" in doc
    for line in LINES.values():
        assert line.releases.startswith("TensorRT-LLM ")
