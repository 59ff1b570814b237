"""`eagle-trt convert TARGET --draft-model SMALL`: a checkpoint whose draft is a small LM with the target's tokenizer.

    eagle-trt convert models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --draft-model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --output checkpoints/qwen-1.5b-draft-0.5b

    OUT/target/       the target, as in an EAGLE-3 checkpoint
    OUT/draft/        the small model: config.json, model.safetensors and its tokenizer files (build checks them
                      against the target's again)
    OUT/convert.json  {"draft_kind": "model", "source": ..., "draft_source": ...}

Nothing is trained, so modelopt is not needed. The two tokenizers are compared before any weights load (the same
vocabulary and special tokens, `eagle_trt.tokenizer_match`); the models are then loaded one after the other, so
the larger of the two sets the peak memory. No FP8 KV scales are calibrated: an fp8 cache runs with scale 1.0.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

from eagle_trt.errors import InputError
from eagle_trt.models.spec import TargetSpec
from eagle_trt.safetensors_stream import parse_size
from eagle_trt.staging import check_apart
from eagle_trt.tokenizer_match import first_difference, hf_tokenizer_terms

from .export import check_output_dir, staged_output, write_manifest, write_target
from .keep_blocks import keep_blocks
from .load_target import load_target, load_tokenizer
from .result import ConvertResult
from .stages import Stages, versions

# A draft model is small: its weights stay one model.safetensors, the file a checkpoint's and an engine's draft/ holds.
ONE_FILE = 1 << 62
# convert's options that make or ship an EAGLE-3 head: meaningless with a draft model.
_HEAD_OPTIONS = {"steps": "--steps", "epochs": "--epochs", "data": "--data", "head": "--head",
                 "draft_vocab_size": "--draft-vocab-size"}


def check_tokenizers(target_path, draft_path) -> None:
    """InputError naming the first difference unless both models' tokenizers agree."""
    diff = first_difference(*hf_tokenizer_terms(load_tokenizer(target_path)),
                            *hf_tokenizer_terms(load_tokenizer(draft_path)))
    if diff is not None:
        raise InputError(f"--draft-model {draft_path} does not share the target's tokenizer: {diff}",
                         hint="a draft model must use the target's tokenizer (same vocabulary and special tokens), "
                              "e.g. a smaller model of the same family")


def convert_with_draft_model(model_path, draft_path, output_dir, overwrite: bool = False, progress: bool = True,
                             head_options: dict | None = None, max_shard_size: str | int = "5GB"):
    """Write OUT with the target and the draft model (see the module doc); returns a ConvertResult."""
    try:
        shard_bytes = {"target": parse_size(max_shard_size), "draft": ONE_FILE}
    except ValueError as e:
        raise InputError(f"--max-shard-size: {e}") from None
    given = [flag for key, flag in _HEAD_OPTIONS.items() if (head_options or {}).get(key) not in (None, 0, [], False)]
    if given:
        raise InputError(f"--draft-model drafts with a small LM, which needs no head: drop {', '.join(given)}")
    out = check_output_dir(output_dir, overwrite)
    check_apart(model_path, out, "the model being converted")
    check_apart(draft_path, out, "the --draft-model")
    if Path(draft_path).expanduser().resolve() == Path(model_path).expanduser().resolve():
        raise InputError("--draft-model is the target itself; give a smaller model that shares its tokenizer")
    stages = Stages(progress)
    with stages.stage("tokenizers", "Comparing the target's and the draft model's tokenizers"):
        check_tokenizers(model_path, draft_path)
    with staged_output(out, overwrite) as stage:
        infos = {}
        for name, path in (("target", model_path), ("draft", draft_path)):
            with stages.stage(f"load_{name}", f"Loading {path}"):
                model, tokenizer, infos[name] = load_target(path)
            with stages.stage(f"export_{name}", f"Writing {name} model"):
                write_target(model, tokenizer, stage / name, shard_bytes[name])
                if infos[name].format == "gguf":  # the file's own blocks too, for weights / draft_weights: auto
                    keep_blocks(Path(path), stage / name)
            del model, tokenizer  # one model in memory at a time
            gc.collect()
        _check_draft_config(stage / "draft" / "config.json")
        manifest = {"draft_kind": "model", "source": infos["target"].to_dict(),
                    "draft_source": infos["draft"].to_dict(), "steps": 0, "versions": versions()}
        write_manifest(stage, manifest)
    summary = {"output_dir": str(out), "target_dir": str(out / "target"), "draft_dir": str(out / "draft"),
               **manifest, "timings_s": stages.timings, "peak_rss_mb": stages.peak_rss_mb}
    return ConvertResult(out, out / "target", out / "draft", summary)


def _check_draft_config(path: Path) -> None:
    """The runtime must be able to run the written draft (its architecture and shapes parse)."""
    TargetSpec.from_hf_config(json.loads(path.read_text(encoding="utf-8")), str(path))
