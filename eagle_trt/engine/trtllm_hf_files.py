"""The HF files of a trtllm bundle in the form both transformers generations read the same way.

TensorRT-LLM 1.2 pins transformers 4.57, while `eagle-trt convert` runs transformers 5, whose files
4.57 misreads in three places. Each rewrite below keeps the file valid for transformers 5 too:

- tokenizer_config.json: transformers 5 names its generic fast tokenizer `TokenizersBackend`, a class
  4.57's AutoTokenizer does not have; `PreTrainedTokenizerFast` is that class in both generations.
- config.json: transformers 5 writes RoPE as `rope_parameters` only; 4.57 reads `rope_theta` and
  `rope_scaling`, and without them silently uses theta 10000. Both forms are written.
- the draft's config.json: modelopt writes `rope_scaling: {rope_type: default, ...}`, which
  TensorRT-LLM's RoPE parser rejects (default means no scaling); it becomes null.

The draft's weights take TensorRT-LLM's module names: its EAGLE-3 draft model calls the decoder layer
`midlayer` (1.3+ also maps `layers.0.*`, 1.2 may not).

    >>> model_config({"rope_parameters": {"rope_type": "default", "rope_theta": 1e5}})["rope_theta"]
    100000.0
    >>> tokenizer_config({"tokenizer_class": "TokenizersBackend"})["tokenizer_class"]
    'PreTrainedTokenizerFast'
"""

from __future__ import annotations

import json
from pathlib import Path

# transformers-5 tokenizer class names that transformers 4.57's AutoTokenizer cannot resolve.
V5_ONLY_TOKENIZER_CLASSES = frozenset({"TokenizersBackend"})
GENERIC_FAST_TOKENIZER = "PreTrainedTokenizerFast"
DRAFT_LAYER = "midlayer"


def tokenizer_config(data: dict) -> dict:
    out = dict(data)
    if out.get("tokenizer_class") in V5_ONLY_TOKENIZER_CLASSES:
        out["tokenizer_class"] = GENERIC_FAST_TOKENIZER
    return out


def model_config(data: dict) -> dict:
    """Add the transformers-4 RoPE keys (rope_theta, rope_scaling) next to transformers 5's rope_parameters."""
    out = dict(data)
    params = out.get("rope_parameters")
    # Per-layer-type parameters (a dict of dicts) have no single transformers-4 form: left as they are.
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        return out
    if "rope_theta" in params and "rope_theta" not in out:
        out["rope_theta"] = float(params["rope_theta"])
    if "rope_scaling" not in out:
        kind = params.get("rope_type", "default")
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        out["rope_scaling"] = None if kind == "default" else scaling
    return out


def draft_config(data: dict) -> dict:
    out = model_config(data)
    scaling = out.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        if "rope_theta" in scaling and "rope_theta" not in out:
            out["rope_theta"] = float(scaling["rope_theta"])
        out["rope_scaling"] = None
    return out


def draft_tensor_names(tensors: dict, num_layers: int) -> dict:
    """modelopt's `layers.{i}.*` -> TensorRT-LLM's `midlayer.*` (one layer) or `midlayer.{i}.*`."""
    out = {}
    for name, tensor in tensors.items():
        if name.startswith("layers."):
            index, rest = name[len("layers."):].split(".", 1)
            name = f"{DRAFT_LAYER}.{rest}" if num_layers == 1 else f"{DRAFT_LAYER}.{index}.{rest}"
        out[name] = tensor
    return out


def rewrite_dir(root: Path) -> None:
    """Rewrite a bundle's target, draft and tokenizer JSON files in place (inside the build's temp dir)."""
    for path, fix in ((root / "target" / "config.json", model_config), (root / "draft" / "config.json", draft_config),
                      (root / "target" / "tokenizer_config.json", tokenizer_config),
                      (root / "draft" / "tokenizer_config.json", tokenizer_config),  # a draft model's
                      (root / "tokenizer" / "tokenizer_config.json", tokenizer_config)):  # fmt: skip
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            path.write_text(json.dumps(fix(data), sort_keys=True, indent=2) + "\n", encoding="utf-8")
