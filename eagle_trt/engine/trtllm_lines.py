"""The TensorRT-LLM release lines a trtllm bundle can be written for, and what each line reads.

A line is a range of TensorRT-LLM releases that read the same bundle. Each fact below was read in
TensorRT-LLM's source and versioned API reference; tests/fixtures/trtllm_contract_<line>.json holds
the field sets with the repository, path and commit or tag they came from, and the contract tests
check that a bundle never writes a field its line lacks.

    >>> line_for("1.2.1").name, line_for("1.3.0rc27").name, line_for("1.4.0rc4").name
    ('1.2', '1.3+', '1.3+')
    >>> LINES["1.2"].runs_trees
    False
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Top-level LLM-API fields every bundle writes (BaseLlmArgs / TorchLlmArgs in both lines).
LLM_ARGS_WRITTEN = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width",
                    "return_perf_metrics", "kv_cache_config", "speculative_config")  # fmt: skip
KV_CACHE_WRITTEN = ("dtype",)


@dataclass(frozen=True)
class Line:
    """One TensorRT-LLM release line as a bundle sees it."""

    name: str  # the value of eagle_config.yaml's trtllm_version
    releases: str  # human description of the releases it covers
    first: tuple[int, int]  # (major, minor) of its first release
    runs_trees: bool  # one-model EAGLE-3 honours use_dynamic_tree / max_total_draft_tokens
    typical_acceptance: bool  # Eagle3DecodingConfig has greedy_sampling / posterior_threshold
    legacy_engine_flow: bool  # trtllm-build --speculative_decoding_mode eagle (EAGLE-1/2 heads) exists
    transformers_pin: str | None  # the transformers release the line pins (None: not read for this line)
    speculative_fields: frozenset[str]  # Eagle3DecodingConfig fields a bundle of this line may write
    runtime_fields: frozenset[str]  # fields `eagle-trt run` may add at run time (sampling modes)
    # DraftTargetDecodingConfig (decoding_type "Draft_Target"; a draft model) fields a bundle may write. Both lines
    # reset max_total_draft_tokens to max_draft_len: the draft model proposes a chain.
    draft_target_fields: frozenset[str] = frozenset({"decoding_type", "max_draft_len", "speculative_model"})


_CHAIN = frozenset({"decoding_type", "max_draft_len", "speculative_model", "eagle3_layers_to_capture"})
_TREE = frozenset({"use_dynamic_tree", "dynamic_tree_max_topK", "max_total_draft_tokens"})

LINES: dict[str, Line] = {
    "1.2": Line(
        name="1.2", releases="TensorRT-LLM 1.2.x (the stable line)", first=(1, 2),
        # Its one-model EAGLE-3 worker drafts a linear chain of max_draft_len tokens: tree fields are ignored.
        runs_trees=False, typical_acceptance=True, legacy_engine_flow=True, transformers_pin="4.57.1",
        speculative_fields=_CHAIN, runtime_fields=frozenset({"greedy_sampling", "posterior_threshold", "allow_advanced_sampling"}),
    ),
    "1.3+": Line(
        name="1.3+", releases="TensorRT-LLM 1.3 release candidates, 1.4 and main", first=(1, 3),
        # Dynamic trees run in the one-model path; static trees (eagle_choices), greedy_sampling,
        # posterior_threshold and eagle3_one_model are gone, and Eagle3DecodingConfig forbids unknown fields.
        runs_trees=True, typical_acceptance=False, legacy_engine_flow=False, transformers_pin=None,
        speculative_fields=_CHAIN | _TREE, runtime_fields=frozenset(),
    ),
}  # fmt: skip
DEFAULT_LINE = "1.3+"

_VERSION = re.compile(r"^(\d+)\.(\d+)")


def line_for(version: str | None) -> Line | None:
    """The line an installed TensorRT-LLM version belongs to; None for releases before 1.2 or no version."""
    match = _VERSION.match(version or "")
    if not match:
        return None
    key = (int(match.group(1)), int(match.group(2)))
    found = None
    for line in sorted(LINES.values(), key=lambda ln: ln.first):
        if key >= line.first:
            found = line
    return found
