"""Read-only checks of a converted checkpoint (the output of `eagle-trt convert`) against a config.

Nothing here writes: `eagle-trt build --dry-run` runs exactly these checks and stops. The result, a
CheckpointPlan, is everything the builder needs to write an engine dir.

    >>> from eagle_trt.config import load_config
    >>> from eagle_trt.engine.checkpoint import inspect_checkpoint
    >>> plan = inspect_checkpoint(load_config("configs/eagle_config.yaml"), Path("ckpt"))  # doctest: +SKIP
    >>> plan.head_kind, plan.draft_info["aux_layer_ids"]                                  # doctest: +SKIP
    ('eagle3', [1, 14, 26])

Two draft-head layouts are recognised: EAGLE-3 (one decoder layer reading [embedding ; fused aux
hidden states], `hidden_norm`, fc over n_aux * hidden) and EAGLE-1/2 (fc over [embedding ; last
hidden], plain Llama decoder layers). The torch runtime executes EAGLE-3 heads only; EAGLE-1/2 heads
are accepted for backend trtllm, which writes TensorRT-LLM's legacy engine checkpoint for them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from eagle_trt.config import EagleArchitecture, EagleConfig
from eagle_trt.config.schema import DraftConfig
from eagle_trt.engine.datastore_file import DATASTORE_NAME, check_datastore
from eagle_trt.engine.draft_model_checks import check_model_draft, is_model_draft
from eagle_trt.engine.head_checks import (
    check_aux_ids,
    check_draft_vocab,
    check_eagle1_shapes,
    check_eagle3_shapes,
    check_head_values,
    check_kv_scales,
    config_int,
    head_architecture,
    head_kind,
)
from eagle_trt.errors import CheckpointError, ConfigError
from eagle_trt.safetensors_stream import tensor_locations
from eagle_trt.shards import index_shards

KV_SCALES_NAME = "kv_scales.safetensors"

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
)  # fmt: skip
_TOKENIZER_CORE = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass
class CheckpointPlan:
    """What inspect_checkpoint found; _write_engine needs nothing else."""

    target_config: dict
    target_weights: list[Path]
    target_extra_files: list[Path]
    tokenizer_files: list[Path]
    draft_weights: Path
    engine_draft_config: dict
    architecture: EagleArchitecture | None  # None for a draft model
    target_info: dict
    draft_info: dict
    head_kind: str = "eagle3"  # or "eagle1" (EAGLE-1/2 layout; backend trtllm only), or "model" (a small LM)
    kv_scales: Path | None = None  # CKPT/kv_scales.safetensors, checked, when present
    datastore: Path | None = None  # CKPT/draft/datastore.safetensors, checked, when present
    draft_config: DraftConfig | None = None  # the config's `draft`, resolved from the checkpoint


def inspect_checkpoint(cfg: EagleConfig, ckpt: Path) -> CheckpointPlan:
    """Check that ckpt (output of `eagle-trt convert`) exists, is complete and fits cfg."""
    if not ckpt.is_dir():
        if ckpt.is_file() and ckpt.suffix.lower() == ".gguf":
            raise CheckpointError(f"checkpoint '{ckpt}' is a GGUF model file, not a checkpoint dir",
                                  hint=f"make a checkpoint from it first: `eagle-trt convert {ckpt} --output DIR`, "
                                       "then build with --checkpoint DIR")
        if ckpt.exists():
            raise CheckpointError(f"checkpoint '{ckpt}' is a file, not a checkpoint dir",
                                  hint="pass the dir `eagle-trt convert --output` wrote")
        raise CheckpointError(f"checkpoint dir '{ckpt}' not found", hint="create it with `eagle-trt convert`")
    tdir, ddir = ckpt / "target", ckpt / "draft"
    for sub in (tdir, ddir):
        if not sub.is_dir():
            raise CheckpointError(
                f"checkpoint '{ckpt}' has no {sub.name}/ dir (is it `eagle-trt convert` output?)"
            )
    target = _inspect_target(tdir)
    dcfg_path = ddir / "config.json"
    dcfg = _read_json(dcfg_path)
    dweights = ddir / "model.safetensors"
    if not dweights.is_file():
        raise CheckpointError(f"draft weights '{dweights}' not found")
    raw = _shapes(dweights)
    kind = "model" if is_model_draft(raw) else "eagle3"
    if cfg.draft is not None and cfg.draft.kind != kind:
        what = "a small language model" if kind == "model" else "an EAGLE head"
        raise ConfigError(f"draft.kind is '{cfg.draft.kind}' but the draft in '{ddir}' is {what}; set draft.kind: "
                          f"{kind} or remove draft to take it from the checkpoint")
    _check_positions(cfg, target.positions, target.config_path)
    common = dict(target_config=target.config, target_weights=target.weights, tokenizer_files=target.tokenizer_files,
                  target_extra_files=[p for p in [tdir / "generation_config.json"] if p.is_file()],
                  draft_weights=dweights, target_info=_target_info(target.config, *target.hvl),
                  kv_scales=check_kv_scales(ckpt / KV_SCALES_NAME, target.hvl[1]))
    if kind == "model":
        return CheckpointPlan(
            **common, engine_draft_config=dcfg, architecture=None, head_kind="model",
            draft_info=check_model_draft(cfg, dcfg, dcfg_path, raw, dweights, tdir),
            draft_config=DraftConfig(kind="model"),
        )
    return _head_plan(cfg, target, dcfg, dcfg_path, dweights, raw, common)


@dataclass
class _Target:
    config: dict
    config_path: Path
    hvl: tuple[int, int, int]  # hidden_size, num_hidden_layers, vocab_size
    positions: int
    weights: list[Path]
    tokenizer_files: list[Path]


def _inspect_target(tdir: Path) -> _Target:
    """The target's config, shapes, weight files and tokenizer, each checked."""
    tcfg_path = tdir / "config.json"
    tcfg = _read_json(tcfg_path)
    H, L, V, P = (
        config_int(tcfg, k, tcfg_path)
        for k in ("hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings")
    )
    weights = _target_shards(tdir, [V, H])
    tokenizer_files = [tdir / n for n in TOKENIZER_FILES if (tdir / n).is_file()]
    if not any(p.name in _TOKENIZER_CORE for p in tokenizer_files):
        raise CheckpointError(f"no tokenizer in '{tdir}' (expected one of {', '.join(_TOKENIZER_CORE)})")
    return _Target(tcfg, tcfg_path, (H, L, V), P, weights, tokenizer_files)


def _head_plan(cfg: EagleConfig, target: _Target, dcfg: dict, dcfg_path: Path, dweights: Path, raw: dict,
               common: dict) -> CheckpointPlan:
    """The plan for an EAGLE head: its architecture against the config and the target, its tensors' shapes, aux
    layers, draft vocabulary and datastore."""
    H, L, V = target.hvl
    arch, heads_kv, head_dim = _head_architecture(cfg, dcfg, dcfg_path, target)
    # Official EAGLE-3 checkpoints call the decoder layer "midlayer"; check both layouts as one.
    key_map = {k: "layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k for k in raw}
    if len(set(key_map.values())) != len(key_map):
        raise CheckpointError(f"'{dweights}' has both midlayer.* and layers.0.* tensors")
    shapes = {key_map[k]: s for k, s in raw.items()}
    kind = head_kind(shapes, H)
    eagle_cfg = dict(dcfg.get("eagle_config") or {})
    if kind == "eagle1":
        if cfg.backend != "trtllm":
            raise CheckpointError(
                f"'{dweights}' is an EAGLE-1/2 head (fc.weight {shapes['fc.weight']}, no hidden_norm); "
                f"the {cfg.backend} backend runs EAGLE-3 heads only",
                hint="build it with `--backend trtllm --trtllm-version 1.2`: TensorRT-LLM 1.2 still has the legacy "
                "EAGLE engine flow (the bundle holds its checkpoint and trtllm-build command); later lines do not",
            )
        check_eagle1_shapes(shapes, dweights, dcfg_path, arch, heads_kv, head_dim, V)
        aux: list[int] = []
    else:
        # `eagle-trt convert` writes the aux ids flat; modelopt's export nests them in eagle_config.
        aux = dcfg.get("eagle_aux_hidden_state_layer_ids") or eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
        aux = check_aux_ids(aux or sorted({1, max(0, L // 2 - 1), max(0, L - 4)}), L, dcfg_path)  # modelopt's default
        check_eagle3_shapes(shapes, dweights, dcfg_path, arch, heads_kv, head_dim, len(aux))
    vocab = check_draft_vocab(shapes, dcfg, dweights, dcfg_path, H, V)
    check_head_values(_tensors(dweights), dweights, V, vocab)
    datastore = dweights.parent / DATASTORE_NAME
    if datastore.is_file():
        check_datastore(datastore, V)
    else:
        datastore = None
    # The checkpoint's draft config as-is (rope, eps: nothing guessed), plus every resolved shape
    # field, so the runtime never has to re-derive a default differently from these checks.
    engine_draft = {**dcfg, **arch.model_dump(), "num_key_value_heads": heads_kv, "head_dim": head_dim}
    engine_draft.update(vocab_size=V, draft_vocab_size=vocab)
    if kind == "eagle3":
        eagle_cfg["eagle_aux_hidden_state_layer_ids"] = aux
        engine_draft.update(eagle_aux_hidden_state_layer_ids=aux, eagle_config=eagle_cfg)
    return CheckpointPlan(
        **common,
        engine_draft_config=engine_draft,
        architecture=arch,
        draft_info={"kind": kind, "hidden_size": H, "draft_vocab_size": vocab, "aux_layer_ids": aux},
        draft_config=DraftConfig(kind="eagle3") if kind == "eagle3" else cfg.draft,
        head_kind=kind,
        datastore=datastore,
    )


def _head_architecture(cfg: EagleConfig, dcfg: dict, dcfg_path: Path, target: _Target):
    """The head's architecture from its config, checked against the target's hidden size and the config's
    eagle_architecture: (arch, kv heads, head_dim)."""
    H = target.hvl[0]
    arch, heads_kv, head_dim = head_architecture(dcfg, dcfg_path, target.positions)
    if cfg.eagle_architecture is not None and cfg.eagle_architecture.hidden_size != H:
        raise ConfigError(
            f"eagle_architecture.hidden_size ({cfg.eagle_architecture.hidden_size}) does not match "
            f"hidden_size ({H}) of the target in '{target.config_path}'"
        )
    if arch.hidden_size != H:
        raise CheckpointError(
            f"draft hidden_size ({arch.hidden_size}) in '{dcfg_path}' does not match the target "
            f"hidden_size ({H}) in '{target.config_path}'"
        )
    if cfg.eagle_architecture is not None:
        pos_src = dcfg_path if "max_position_embeddings" in dcfg else target.config_path
        for name, want in cfg.eagle_architecture.model_dump().items():
            have = getattr(arch, name)
            if want != have:
                src = pos_src if name == "max_position_embeddings" else dcfg_path
                raise ConfigError(
                    f"eagle_architecture.{name} ({want}) does not match {name} ({have}) in '{src}'"
                )
    return arch, heads_kv, head_dim


def _check_positions(cfg: EagleConfig, positions: int, tcfg_path: Path) -> None:
    if cfg.max_input_len + cfg.max_output_len > positions:
        raise ConfigError(
            f"max_input_len ({cfg.max_input_len}) + max_output_len ({cfg.max_output_len}) = "
            f"{cfg.max_input_len + cfg.max_output_len} exceeds max_position_embeddings ({positions}) "
            f"of the target in '{tcfg_path}'"
        )


def _target_info(tcfg: dict, hidden: int, layers: int, vocab: int) -> dict:
    return {"architecture": (tcfg.get("architectures") or [tcfg.get("model_type") or "unknown"])[0],
            "hidden_size": hidden, "num_layers": layers, "vocab_size": vocab}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"'{path}' not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"cannot read '{path}': {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"'{path}' must hold a JSON object")
    return data


def _target_shards(tdir: Path, embed_shape: list[int]) -> list[Path]:
    """The target's safetensors file(s); each header must parse and the embedding must fit."""
    index = tdir / "model.safetensors.index.json"
    if (tdir / "model.safetensors").is_file():
        shards = [tdir / "model.safetensors"]
    elif index.is_file():
        shards = index_shards(index)
        if not shards:
            raise CheckpointError(f"'{index}' has an empty weight_map")
    else:
        raise CheckpointError(
            f"no weights in '{tdir}' (expected model.safetensors or model.safetensors.index.json)"
        )
    for shard in shards:
        if not shard.is_file():
            raise CheckpointError(f"weight shard '{shard}' not found")
    tensor_locations(shards, index if shards[0].name != "model.safetensors" else None)  # each tensor in one place
    for shard in shards:
        emb = _shapes(shard).get("model.embed_tokens.weight")
        if emb is not None and emb != embed_shape:
            raise CheckpointError(
                f"'{shard}': model.embed_tokens.weight has shape {emb} but '{tdir / 'config.json'}' "
                f"implies {embed_shape} (vocab_size, hidden_size)"
            )
    return shards


def _tensors(path: Path) -> dict:
    """Every tensor of a draft's safetensors (a head: small), its names as in _head_plan's shapes."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for bad files
        raise CheckpointError(f"'{path}' is not a readable safetensors file: {exc}") from exc
    return {"layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k: t for k, t in tensors.items()}


def _shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes from the safetensors header only (no weights are read)."""
    try:
        with safe_open(str(path), "pt") as fh:
            return {k: list(fh.get_slice(k).get_shape()) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"'{path}' is not a readable safetensors file: {exc}") from exc
