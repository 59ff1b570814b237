"""scripts/extract_trtllm_contract.py on a small source tree shaped like TensorRT-LLM's.

The tree is written here (pydantic-style classes with inheritance, private attributes, class
variables, validation aliases, a strict base, an EAGLE-3 draft model and a click command), so the
extraction rules are checked without a TensorRT-LLM checkout; the committed contract fixtures use
the same layout, so a re-extraction from a real checkout drops into them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import extract_trtllm_contract as ex  # noqa: E402

LLM_ARGS = '''
from typing import ClassVar, Literal, Optional
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr

class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = Field(default=None, description="depth")
    speculative_model: Optional[str] = Field(default=None, validation_alias=AliasChoices("speculative_model",
                                                                                      "speculative_model_dir"))
    _private: bool = PrivateAttr(True)
    kind: ClassVar[str] = "base"

class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle"] = Field(default="Eagle")
    use_dynamic_tree: Optional[bool] = False
    internal: Optional[int] = Field(default=1, init=False)

class Eagle3DecodingConfig(EagleDecodingConfig):
    decoding_type: Literal["Eagle3"] = Field(default="Eagle3")

class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Draft_Target"] = Field(default="Draft_Target")
    _one_model: bool = PrivateAttr(True)

class KvCacheConfig(StrictBaseModel):
    dtype: str = "auto"

class BaseLlmArgs(StrictBaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")
    max_batch_size: Optional[int] = 2048
    speculative_config: Optional[object] = None

class TorchLlmArgs(BaseLlmArgs):
    return_perf_metrics: bool = False
'''
SPECULATIVE = '''
import re
class Eagle3DecoderLayer:
    def __init__(self, cfg):
        self.self_attn = Attn(cfg)
        self.hidden_norm = Norm(cfg)
        self._flag = Thing()
class Eagle3DraftModel:
    def __init__(self, cfg):
        self.fc = Linear(cfg)
        self.midlayer = Eagle3DecoderLayer(cfg)
        self.dtype = cfg.dtype
@register_auto_model("EAGLE3LlamaForCausalLM")
class Eagle3ForCausalLM:
    def load_weights(self, weights):
        return {re.sub(r"^layers\\.0\\.", "midlayer.", k): v for k, v in weights.items()}
'''
SERVE = '''
import click
@click.command("serve")
@click.argument("model")
@click.option("--host", type=str, default="localhost")
@click.option("--config", "--extra_llm_api_options", "extra_llm_api_options", type=str)
def serve(model, host, extra_llm_api_options):
    pass
'''


def source_tree(root: Path) -> Path:
    for rel, text in ((ex.LLM_ARGS, LLM_ARGS), (ex.SPECULATIVE, SPECULATIVE), (ex.SERVE, SERVE)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_extracts_fields_aliases_tags_and_strictness(tmp_path):
    out = ex.extract(source_tree(tmp_path / "src"))
    e3 = out["classes"]["Eagle3DecodingConfig"]
    assert e3["fields"] == ["max_draft_len", "speculative_model", "decoding_type", "use_dynamic_tree"]
    assert e3["aliases"] == {"speculative_model_dir": "speculative_model"}
    assert e3["tags"] == {"decoding_type": "Eagle3"} and e3["extra"] == "forbid"
    dt = out["classes"]["DraftTargetDecodingConfig"]
    assert dt["fields"] == ["max_draft_len", "speculative_model", "decoding_type"]
    assert dt["tags"] == {"decoding_type": "Draft_Target"} and dt["extra"] == "forbid"
    assert out["classes"]["TorchLlmArgs"]["fields"] == ["max_batch_size", "speculative_config", "return_perf_metrics"]
    assert out["classes"]["KvCacheConfig"]["fields"] == ["dtype"]
    assert out["draft_checkpoint"] == {"draft_model_modules": ["fc", "midlayer"],
                                       "decoder_layer_modules": ["hidden_norm", "self_attn"],
                                       "maps_layers_prefix": True, "registered_as": ["EAGLE3LlamaForCausalLM"]}
    assert out["trtllm_serve_options"] == ["--config", "--extra_llm_api_options", "--host"]
    assert set(out["files"]) == {ex.LLM_ARGS, ex.SPECULATIVE, ex.SERVE}
    assert out["decoding_types"] == ["Draft_Target", "Eagle", "Eagle3"]  # the Literal tags of DecodingBaseConfig's tree


# Before PR #10124: decoding_type is no field; DecodingBaseConfig.from_dict dispatches over a dict of names.
OLD_DISPATCH = """
class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = None
    @classmethod
    def from_dict(cls, data: dict):
        config_classes = {"MTP": MTPDecodingConfig, "Eagle": EagleDecodingConfig, "DraftTarget": DraftTargetDecodingConfig}
        return config_classes.get(data.get("decoding_type"))(**data)
class EagleDecodingConfig(DecodingBaseConfig):
    eagle3_one_model: Optional[bool] = True
"""


def test_decoding_types_of_a_release_before_the_eagle3_tag():
    assert ex.parse_decoding_types(OLD_DISPATCH) == ["DraftTarget", "Eagle", "MTP"]
    assert ex.parse_decoding_types("class Unrelated:\n    decoding_type: Literal['X'] = 'X'\n") == []


def test_a_commit_given_for_single_files_is_recorded(tmp_path):
    src = source_tree(tmp_path / "src")
    fixture = tmp_path / "contract.json"
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert ex.main(["--source", str(src), "--line", "1.2", "--ref", "v1.2.1", "--commit", sha, "--out", str(fixture)]) == 0
    assert json.loads(fixture.read_text())["extracted"]["source"]["commit"] == sha
    assert ex.main(["--source", str(src), "--line", "1.2", "--ref", "v1.2.1", "--commit", "v1.2.1"]) == 2


def test_rewrites_only_the_extracted_part_of_a_fixture(tmp_path):
    src = source_tree(tmp_path / "src")
    fixture = tmp_path / "contract.json"
    fixture.write_text(json.dumps({"line": "1.2", "sources": ["kept"], "pins": ["torch==2.9.1"], "extracted": {}}))
    assert ex.main(["--source", str(src), "--line", "1.2", "--ref", "v1.2.1", "--out", str(fixture)]) == 0
    doc = json.loads(fixture.read_text())
    assert doc["sources"] == ["kept"] and doc["pins"] == ["torch==2.9.1"]
    assert doc["extracted"]["source"] == {"repo": "NVIDIA/TensorRT-LLM", "ref": "v1.2.1", "commit": None}
    assert ex.main(["--source", str(tmp_path), "--line", "1.2", "--ref", "x"]) == 2  # not a checkout


def test_committed_fixtures_have_the_extracted_layout(tmp_path):
    produced = ex.extract(source_tree(tmp_path / "src"))
    for name in ("trtllm_contract_1.2.json", "trtllm_contract_1.3.json"):
        extracted = json.loads((REPO / "tests" / "fixtures" / name).read_text())["extracted"]
        # decoding_types is new in the extractor; the committed sets were read before it (by hand, see "sources"),
        # and their floors are recorded under "version_floors".
        assert set(produced) - {"files", "decoding_types"} <= set(extracted), name
        for cls, info in extracted["classes"].items():
            assert set(produced["classes"]["Eagle3DecodingConfig"]) == set(info), (name, cls)
        assert set(extracted["draft_checkpoint"]) == set(produced["draft_checkpoint"])
