"""Which engine's layout a head dir is in, from its config and tensor names; anything ambiguous is an error.

    detect_format(config, names, note=None, source="head/config.json")   # -> "modelopt" | "vllm" | ... 

- `eagle_trt.json` beside the files (what `eagle-trt export` writes): its format, exactly.
- a `speculators_config` or `speculators_model_type`: speculators.
- `midlayer.*` tensors: the official EAGLE release and SGLang/SpecForge (read the SGLang way, which also covers the
  official heads: both capture before layer j and normalise the feature with hidden_norm only).
- `layers.0.*` with modelopt's eagle_config fields (`use_input_layernorm_in_first_layer`): modelopt (eagle-trt's own).
- `layers.0.*` without them: modelopt's and vLLM's exports look alike there but mean different layers and norms.
"""

from __future__ import annotations

from eagle_trt.errors import CheckpointError
from eagle_trt.interop.formats import FORMATS

NOTE_NAME = "eagle_trt.json"
_MODELOPT_MARKERS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm")


def detect_format(cfg: dict, names: list[str], note: dict | None, source: str) -> str:
    if note is not None:
        fmt = note.get("format")
        if fmt not in FORMATS:
            raise CheckpointError(f"{source}: eagle_trt.json names format {fmt!r}, not one of {', '.join(FORMATS)}")
        return fmt
    mid = any(n.startswith("midlayer.") for n in names)
    layers0 = any(n.startswith("layers.0.") for n in names)
    if mid and layers0:
        raise CheckpointError(f"{source}: the weights hold both midlayer.* and layers.0.* tensors; keep one layout")
    if not mid and not layers0:
        raise CheckpointError(f"{source}: no midlayer.* or layers.0.* tensors: not an EAGLE-3 draft head")
    if not any(n.endswith("hidden_norm.weight") for n in names):
        raise CheckpointError(f"{source}: no hidden_norm tensor: an EAGLE-1/2 head, not EAGLE-3 (eagle-trt runs those "
                              "only in a TensorRT-LLM bundle built from a checkpoint that holds one)")
    if cfg.get("speculators_config") is not None or cfg.get("speculators_model_type") is not None:
        if cfg.get("speculators_model_type", "eagle3") != "eagle3":
            raise CheckpointError(f"{source}: speculators_model_type {cfg['speculators_model_type']!r} is not an "
                                  "EAGLE-3 head (eagle3)")
        return "speculators"
    if mid:
        return "sglang"
    eagle_cfg = cfg.get("eagle_config") or {}
    if any(k in eagle_cfg for k in _MODELOPT_MARKERS):
        return "modelopt"
    raise CheckpointError(
        f"{source}: layers.0.* tensors without modelopt's eagle_config or a speculators_config: cannot tell a modelopt "
        "head (ids = layer outputs, feature normed twice) from a vLLM one (ids = before layer, hidden_norm only); "
        "add eagle_config.use_input_layernorm_in_first_layer: true if it is modelopt's")
