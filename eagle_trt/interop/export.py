"""`eagle-trt export`: an eagle-trt head (a checkpoint's, an engine's, or a head dir) in one engine's layout.

    result = export_head(Path("engines/smol"), "vllm", Path("/tmp/smol-vllm"))
    result["exact"], result["aux_layer_ids"]     # False (vLLM normalises the feature once), [2, 15, 27]

Writes OUT/config.json and OUT/model.safetensors as that engine loads them (ids, names, vocab maps, norm flags from
`formats.FORMATS`), and OUT/eagle_trt.json: the note of what the head is (the target it belongs to, the ids in
eagle-trt's meaning, the computation it was trained with), which the engines ignore and `convert --head` reads back.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from eagle_trt.engine.head_checks import TargetDims, check_head, config_int
from eagle_trt.errors import CheckpointError, InputError
from eagle_trt.interop.detect import NOTE_NAME
from eagle_trt.interop.formats import format_named
from eagle_trt.interop.import_head import CONFIG, WEIGHTS, read_head_dir
from eagle_trt.interop.layout import Head, to_format
from eagle_trt.models.weights import read_json
from eagle_trt.staging import check_apart, staged_dir, swap_into_place

COST = ("{engine} normalises the head's feature once (hidden_norm) where eagle-trt trained it normed twice "
        "(input_layernorm, then hidden_norm): the head loads and runs there, at the acceptance docs/interop.md "
        "measures for that computation, not the one eagle-trt reports")
COST_MIDLAYER = ("{engine} normalises the head's feature twice (input_layernorm, then hidden_norm) where this head "
                 "was trained with hidden_norm only: export it for an engine that computes hidden_norm only")


def _source_dirs(src: Path) -> tuple[Path, Path | None]:
    """(the head dir, the target dir or None) of a checkpoint, an engine, or a bare head dir."""
    if (src / "trtllm.json").is_file():
        raise InputError(f"'{src}' is a TensorRT-LLM bundle, whose draft names say nothing of the head's computation; "
                         "export from the checkpoint it was built from")
    if (src / "draft" / CONFIG).is_file():
        return src / "draft", (src / "target") if (src / "target" / CONFIG).is_file() else None
    if (src / CONFIG).is_file() and (src / WEIGHTS).is_file():
        return src, None
    raise InputError(f"'{src}' is not a checkpoint, an engine or a head dir (no draft/config.json, no "
                     "config.json + model.safetensors)")


def _target_name(src: Path) -> str | None:
    """Where a checkpoint's target came from (convert.json); an engine or head dir does not say."""
    if (src / "convert.json").is_file():
        return (read_json(src / "convert.json").get("source") or {}).get("path")
    return None


def _target_lm_head(target_dir: Path):
    """The target's output projection (its embedding when tied), read alone from its safetensors."""
    files = sorted(target_dir.glob("*.safetensors"))
    for want in ("lm_head.weight", "model.embed_tokens.weight"):
        for f in files:
            with safe_open(str(f), "pt") as fh:
                if want in fh.keys():
                    return fh.get_tensor(want)
    raise CheckpointError(f"{target_dir}: no lm_head.weight or model.embed_tokens.weight")


def read_ours(src: Path) -> Head:
    """The eagle-trt head of a checkpoint / engine / head dir (modelopt's layout, or midlayer.* names)."""
    head_dir, target_dir = _source_dirs(src)
    cfg, tensors, _ = read_head_dir(head_dir)
    if "fc.weight" not in tensors:
        raise InputError(f"'{head_dir}' holds no EAGLE-3 head (no fc.weight): a draft model has nothing to export")
    mid = any(k.startswith("midlayer.") for k in tensors)
    tensors = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): t for k, t in tensors.items()}
    target = read_json(target_dir / CONFIG) if target_dir is not None else {}
    target = target.get("text_config") or target
    layers = cfg.get("target_num_hidden_layers") or target.get("num_hidden_layers")
    check_head(cfg, tensors, head_dir / WEIGHTS, head_dir / CONFIG, _target_dims(cfg, target, head_dir / CONFIG))
    return Head(tensors, cfg, hidden_prenorm=not mid, target_layers=layers, target_name=_target_name(src),
                target_dir=target_dir, target_architectures=target.get("architectures"))


def _target_dims(cfg: dict, target: dict, cfg_path: Path) -> TargetDims:
    """The target the head is checked against: its own config.json beside the head, else what the head's config says
    of it (a bare head dir)."""
    src = target or {"hidden_size": cfg.get("target_hidden_size") or cfg.get("hidden_size"),
                     "num_hidden_layers": cfg.get("target_num_hidden_layers"), "vocab_size": cfg.get("vocab_size")}
    where = cfg_path if not target else "the target's config.json"
    layers = src.get("num_hidden_layers")
    return TargetDims(config_int(src, "hidden_size", where), None if layers is None else
                      config_int(src, "num_hidden_layers", where), config_int(src, "vocab_size", where))


def _complete_lm_head(head: Head, fmt_name: str, src: Path) -> None:
    """Engines other than modelopt's want the head's own lm_head: a full-vocab head reuses the target's, copied in."""
    if "lm_head.weight" in head.tensors or fmt_name in ("modelopt", "trtllm"):
        return
    if head.target_dir is None:
        raise InputError(f"'{src}': this head reuses the target's lm_head; export from the checkpoint or engine")
    head.tensors["lm_head.weight"] = _target_lm_head(head.target_dir).to(head.tensors["fc.weight"].dtype)
    head.lm_head_from_target = True


def measured_cost(src: Path, fmt, head: Head, prompts: int) -> dict:
    """τ of an engine's head computed eagle-trt's way and the engine's way (`tau.py`), for the note."""
    from eagle_trt.interop.tau import measure_computations

    if not (src / "manifest.json").is_file():
        raise InputError(f"'{src}' is not an engine: --measure-tau decodes with one (eagle-trt build)")
    cases = {"eagle-trt": (head.hidden_prenorm, None), fmt.engine: (fmt.double_norm, None)}
    taus = measure_computations(src, cases, prompts=prompts)
    return {"prompts": f"the first {prompts} of eagle_trt/data/chat_prompts.jsonl, 64 new tokens, greedy, "
                       "prompt lookup off", **{k: {t: v[t] for t in ("chain", "dynamic")} for k, v in taus.items()}}


def export_head(src: Path, fmt_name: str, out: Path, overwrite: bool = False, measure_prompts: int = 0,
                target_name: str | None = None) -> dict:
    """Write the head of `src` in `fmt_name`'s layout to `out` (atomically); returns the note it wrote. With
    measure_prompts (src an engine, the engine's computation not eagle-trt's), the note holds the τ both give."""
    fmt = format_named(fmt_name)
    src, out = Path(src).expanduser(), Path(out).expanduser().absolute()
    check_apart(src, out, "the head being exported")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise InputError(f"output '{out}' exists; pass --force to replace it")
    head = read_ours(src)
    head.target_name = target_name or head.target_name
    _complete_lm_head(head, fmt_name, src)
    tensors, config = to_format(fmt, head)
    exact = fmt.double_norm == head.hidden_prenorm  # the engine computes what the head was trained with
    note = {
        "format": fmt.name, "engine": fmt.engine, "exact": exact, "hidden_prenorm": head.hidden_prenorm,
        "target": {"name": head.target_name, "num_hidden_layers": head.target_layers,
                   "hidden_size": head.config.get("target_hidden_size"), "vocab_size": head.config.get("vocab_size")},
        "aux_layer_ids": head.aux_ids, "engine_aux_layer_ids": fmt.engine_ids(head.aux_ids),
        "id_meaning": {"eagle-trt": "output of layer i", fmt.engine: "output of layer i" if fmt.id_meaning == "output"
                       else "before layer j (the output of layer j-1)"},
        "lm_head_from_target": head.lm_head_from_target,
        "cost": None if exact else (COST if head.hidden_prenorm else COST_MIDLAYER).format(engine=fmt.engine),
    }
    if measure_prompts and not exact:
        note["tau"] = measured_cost(src, fmt, head, measure_prompts)
    out.parent.mkdir(parents=True, exist_ok=True)
    with staged_dir(out, "partial") as stage:
        save_file({k: t.contiguous() for k, t in sorted(tensors.items())}, str(stage / WEIGHTS),
                  metadata={"format": "pt"})
        (stage / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        (stage / NOTE_NAME).write_text(json.dumps(note, indent=2) + "\n")
        for p in stage.iterdir():
            p.chmod(0o644)
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        swap_into_place(stage, out)
    return note
