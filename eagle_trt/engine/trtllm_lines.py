"""The TensorRT-LLM release lines a trtllm bundle can be written for, and which releases read each.

A line is a range of TensorRT-LLM releases that accept the same bundle. Each fact below was read in
TensorRT-LLM's source, pull requests and versioned API reference; tests/fixtures/trtllm_contract_<line>.json
holds the field sets and floors with the repository, path and commit, tag or pull request they came from, and
the contract tests check that a bundle never writes a field its line lacks.

Releases are compared by (major, minor, patch, pre-release): a `.postN` re-spin or a `.devN` nightly carries the
features of the release it names, so `1.2.0rc6.post3` reads what 1.2.0rc6 reads.

    >>> line_for("1.2.1").name, line_for("1.3.0rc27").name, line_for("1.4.0rc4").name
    ('1.2', '1.3+', '1.3+')
    >>> line_for("1.2.0rc6.post3") is None, line_for("1.3.0rc5").name
    (True, '1.2')
    >>> refusal("1.2.0rc6.post3").split(":")[0]
    'TensorRT-LLM 1.2.0rc6.post3 predates speculative_config.decoding_type Eagle3 and Draft_Target'
    >>> LINES["1.2"].runs_trees
    False
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Top-level LLM-API fields every bundle writes (BaseLlmArgs / TorchLlmArgs in both lines).
LLM_ARGS_WRITTEN = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width",
                    "tensor_parallel_size", "pipeline_parallel_size",
                    "return_perf_metrics", "kv_cache_config", "speculative_config")  # fmt: skip
KV_CACHE_WRITTEN = ("dtype",)

# (major, minor, patch, pre): pre is (0, n) for rcN and (1, 0) for the final release, so every rc sorts first.
Release = tuple[int, int, int, tuple[int, int]]
_FINAL = (1, 0)
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:rc(\d+))?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[\w.]+)?$")


def parse_release(version: str | None) -> Release | None:
    """A TensorRT-LLM version string as a comparable release, or None when it is not one (e.g. '?')."""
    match = _VERSION.match((version or "").strip())
    if not match:
        return None
    major, minor, patch, rc = match.groups()
    return int(major), int(minor), int(patch or 0), (0, int(rc)) if rc is not None else _FINAL


def release_text(release: Release) -> str:
    major, minor, patch, (final, rc) = release
    return f"{major}.{minor}.{patch}" + ("" if final else f"rc{rc}")


# decoding_type "Eagle3" (Eagle3DecodingConfig) and "Draft_Target" arrive with PR #10124: before it,
# DecodingBaseConfig.from_dict (the YAML / trtllm-serve path) knows "Eagle" and "DraftTarget" only and raises
# "Invalid decoding type" for anything else. The first rc after its merge (Dec 2025) is taken as the floor.
EAGLE3_FLOOR: Release = (1, 2, 0, (0, 7))
# The one-model EAGLE-3 dynamic tree and its validator max_draft_len <= max_total_draft_tokens <=
# dynamic_tree_max_topK * max_draft_len come with PR #13081 (Apr 2026; PR #12062 before it asserted the opposite
# bound and was reverted). Earlier 1.3 rcs draft the same chain 1.2 does and still define 1.2's fields.
TREE_FLOOR: Release = (1, 3, 0, (0, 10))


@dataclass(frozen=True)
class Line:
    """One TensorRT-LLM release line as a bundle sees it."""

    name: str  # the value of eagle_config.yaml's trtllm_version
    releases: str  # human description of the releases it covers
    first: Release  # its first release (inclusive)
    until: Release | None  # the first release of the next line (exclusive); None: open-ended
    runs_trees: bool  # one-model EAGLE-3 honours use_dynamic_tree / max_total_draft_tokens
    typical_acceptance: bool  # Eagle3DecodingConfig has greedy_sampling / posterior_threshold
    legacy_engine_flow: bool  # trtllm-build --speculative_decoding_mode eagle (EAGLE-1/2 heads) exists
    transformers_pin: str | None  # the transformers release the line pins (None: not read for this line)
    speculative_fields: frozenset[str]  # Eagle3DecodingConfig fields a bundle of this line may write
    runtime_fields: frozenset[str]  # fields `eagle-trt run` may add at run time (sampling modes)
    # DraftTargetDecodingConfig (decoding_type "Draft_Target"; a draft model) fields a bundle may write. Both lines
    # reset max_total_draft_tokens to max_draft_len: the draft model proposes a chain.
    draft_target_fields: frozenset[str] = frozenset({"decoding_type", "max_draft_len", "speculative_model"})

    def covers(self, release: Release) -> bool:
        return self.first <= release and (self.until is None or release < self.until)

    def range_text(self) -> str:
        end = f" up to (not including) {release_text(self.until)}" if self.until else " and later"
        return f"{release_text(self.first)}{end}"


_CHAIN = frozenset({"decoding_type", "max_draft_len", "speculative_model", "eagle3_layers_to_capture"})
_TREE = frozenset({"use_dynamic_tree", "dynamic_tree_max_topK", "max_total_draft_tokens"})

LINES: dict[str, Line] = {
    "1.2": Line(
        name="1.2", first=EAGLE3_FLOOR, until=TREE_FLOOR,
        releases="TensorRT-LLM 1.2 (1.2.0rc7 to 1.2.x, the stable line; and 1.3.0 rcs before rc10)",
        # Its one-model EAGLE-3 worker drafts a linear chain of max_draft_len tokens: tree fields are ignored.
        runs_trees=False, typical_acceptance=True, legacy_engine_flow=True, transformers_pin="4.57.1",
        speculative_fields=_CHAIN, runtime_fields=frozenset({"greedy_sampling", "posterior_threshold", "allow_advanced_sampling"}),
    ),
    "1.3+": Line(
        name="1.3+", first=TREE_FLOOR, until=None,
        releases="TensorRT-LLM 1.3 (1.3.0rc10 and later), 1.4 and main",
        # Dynamic trees run in the one-model path. greedy_sampling, posterior_threshold and eagle3_one_model are
        # defined up to about 1.3.0rc26 and gone in 1.3.0rc27, eagle_choices goes by 1.4.0rc1: a bundle of this
        # line writes none of them. Eagle3DecodingConfig forbids unknown fields.
        runs_trees=True, typical_acceptance=False, legacy_engine_flow=False, transformers_pin=None,
        speculative_fields=_CHAIN | _TREE, runtime_fields=frozenset(),
    ),
}  # fmt: skip
DEFAULT_LINE = "1.3+"


def line_for(version: str | None) -> Line | None:
    """The line whose bundles an installed TensorRT-LLM version reads; None below the floor or for no version."""
    release = parse_release(version)
    if release is None:
        return None
    return next((line for line in LINES.values() if line.covers(release)), None)


def refusal(version: str | None) -> str | None:
    """Why no bundle line fits this TensorRT-LLM version (one line), or None when one does."""
    release = parse_release(version)
    if release is None:
        return f"'{version}' is not a TensorRT-LLM release version (e.g. 1.2.1, 1.3.0rc27, 1.2.0rc6.post3)"
    if line_for(version) is not None:
        return None
    return (f"TensorRT-LLM {version} predates speculative_config.decoding_type Eagle3 and Draft_Target: its parser "
            "(DecodingBaseConfig.from_dict) takes only Eagle and DraftTarget for these drafters; install "
            f"TensorRT-LLM {release_text(EAGLE3_FLOOR)} or newer")  # fmt: skip


def accepted_releases() -> dict[str, dict]:
    """Each line's release range as plain data: written into trtllm.json, read by the bundle's validate.py."""
    return {name: {"from": release_text(line.first), "before": release_text(line.until) if line.until else None}
            for name, line in LINES.items()}  # fmt: skip
