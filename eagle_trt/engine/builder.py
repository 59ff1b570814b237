"""`eagle-trt build`: check a converted checkpoint against the config, then write an engine dir.

All checks run before anything is written (dry_run stops there). The engine is written into a
hidden temp dir next to the output, verified against its own manifest, and only then renamed into
place, so an interrupted build never leaves a half-written engine where `eagle-trt run` looks.

    >>> from eagle_trt.config import load_config
    >>> from eagle_trt.engine.builder import build_engine
    >>> cfg = load_config("configs/eagle_config.yaml")           # doctest: +SKIP
    >>> build_engine(cfg, dry_run=True).message                  # doctest: +SKIP
    "dry run: checkpoint 'checkpoints/smollm2-135m-instruct' passed all checks; nothing written"
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from eagle_trt.config import EagleArchitecture, EagleConfig, dump_config
from eagle_trt.engine.engine_dir import open_engine
from eagle_trt.engine.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    DraftInfo,
    IoLimits,
    Manifest,
    TargetInfo,
    TreeLimits,
    hash_files,
    library_versions,
    write_manifest,
)
from eagle_trt.errors import CheckpointError, ConfigError, InputError, MissingDependencyError

# Fixed safetensors header metadata: nothing build-specific (time, host, path) may reach the
# weight files, so the same inputs always give byte-identical files and hashes.
_WEIGHT_METADATA = {"format": "pt"}


@dataclass
class BuildSummary:
    """What build_engine did. files: {relative path: {"bytes", "sha256"}} (empty on a dry run)."""

    engine_dir: Path
    backend: str
    dtype: str
    kv_cache_dtype: str
    files: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0
    validated: bool = False  # dry run: all checks passed; build: also re-verified from disk
    message: str = ""


def build_engine(
    cfg: EagleConfig,
    checkpoint_dir: str | Path | None = None,
    output_dir: str | Path | None = None,
    dry_run: bool = False,
    overwrite: bool = True,
) -> BuildSummary:
    """Build engines/<cfg.name> (or output_dir) from checkpoint_dir (or cfg.checkpoint_dir)."""
    start = time.monotonic()
    if cfg.backend == "trtllm":
        raise MissingDependencyError(
            "backend 'trtllm' is not available yet in this eagle-trt version",
            hint="set `backend: torch` in the config",
        )
    if checkpoint_dir is None and cfg.checkpoint_dir is None:
        raise InputError(
            "no checkpoint dir: set checkpoint_dir in the config or pass --checkpoint",
            hint="create one with `eagle-trt convert`",
        )
    ckpt = Path(checkpoint_dir if checkpoint_dir is not None else cfg.checkpoint_dir)
    out = Path(output_dir) if output_dir is not None else Path("engines") / cfg.name
    _check_output(out, overwrite)
    plan = inspect_checkpoint(cfg, ckpt)
    resolved = cfg.model_copy(
        update={
            "checkpoint_dir": str(ckpt),
            "eagle_architecture": plan.architecture,
            "kv_cache_dtype": cfg.resolved_kv_cache_dtype,
        }
    )
    summary = BuildSummary(out, cfg.backend, cfg.dtype, resolved.kv_cache_dtype)
    if dry_run:
        summary.validated = True
        summary.message = f"dry run: checkpoint '{ckpt}' passed all checks; nothing written"
        summary.seconds = time.monotonic() - start
        return summary

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; an engine is ordinary shared data
        manifest = _write_engine(resolved, plan, tmp)
        open_engine(tmp, verify=True)  # read back what we wrote before it replaces anything
        _install(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary.files = {k: v.model_dump() for k, v in manifest.files.items()}
    summary.validated = True
    summary.seconds = time.monotonic() - start
    total = sum(v.bytes for v in manifest.files.values())
    summary.message = f"built '{out}' ({len(manifest.files)} files, {total / 2**20:.1f} MiB, {cfg.dtype})"
    return summary


def _check_output(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise InputError(f"output '{out}' exists and is not a directory")
    if not overwrite:
        raise InputError(f"engine dir '{out}' already exists; remove it or allow overwriting")
    # Replacing deletes the old dir, so only ever replace an engine (or an empty dir).
    if not (out / MANIFEST_NAME).is_file() and any(out.iterdir()):
        raise InputError(f"refusing to replace '{out}': it is not empty and has no {MANIFEST_NAME}")


def _install(tmp: Path, out: Path) -> None:
    """Move the finished engine into place; the old one is removed only after the swap."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)  # put the previous engine back
        raise
    shutil.rmtree(old, ignore_errors=True)


def _write_engine(cfg: EagleConfig, plan: CheckpointPlan, root: Path) -> Manifest:
    for sub in ("target", "draft", "tokenizer"):
        (root / sub).mkdir()
    target_tensors = {}
    for shard in plan.target_weights:
        target_tensors.update(_load(shard))
    _save(target_tensors, root / "target" / "model.safetensors", cfg.dtype)
    del target_tensors
    _write_json(root / "target" / "config.json", _with_dtype(plan.target_config, cfg.dtype))
    for src in plan.target_extra_files:
        shutil.copyfile(src, root / "target" / src.name)

    # Tensor names stay as in the checkpoint: the runtime tells official (midlayer.*) heads from
    # modelopt (layers.0.*) ones by name, and they normalise the hidden input differently.
    _save(_load(plan.draft_weights), root / "draft" / "model.safetensors", cfg.dtype)
    _write_json(root / "draft" / "config.json", _with_dtype(plan.engine_draft_config, cfg.dtype))
    for src in plan.tokenizer_files:
        shutil.copyfile(src, root / "tokenizer" / src.name)
    (root / "eagle_config.yaml").write_text(dump_config(cfg), encoding="utf-8")

    manifest = Manifest(
        format_version=FORMAT_VERSION,
        name=cfg.name,
        backend=cfg.backend,
        created_by=library_versions(),
        dtype=cfg.dtype,
        kv_cache_dtype=cfg.resolved_kv_cache_dtype,
        tree_limits=TreeLimits(**cfg.model_dump(include=set(TreeLimits.model_fields))),
        io_limits=IoLimits(**cfg.model_dump(include=set(IoLimits.model_fields))),
        target=TargetInfo(**plan.target_info),
        draft=DraftInfo(**plan.draft_info),
        files=hash_files(root),
    )
    write_manifest(manifest, root)  # last: its presence marks the engine complete
    return manifest


def _load(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _save(tensors: dict, path: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file

    target = getattr(torch, dtype)
    # Only floating tensors change dtype: d2t offsets and t2d masks must stay exact integers/bools.
    cast = {
        k: (t.to(target) if t.is_floating_point() else t).contiguous()
        for k, t in sorted(tensors.items())
    }
    save_file(cast, str(path), metadata=_WEIGHT_METADATA)


def _with_dtype(config: dict, dtype: str) -> dict:
    out = dict(config)
    out["dtype"] = dtype  # transformers >= 4.56 reads "dtype"; older ones read "torch_dtype"
    if "torch_dtype" in out:
        out["torch_dtype"] = dtype
    return out


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, sort_keys=True, indent=2) + "\n", encoding="utf-8")


# ---- checkpoint checks: everything below only reads -------------------------------------------

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
)  # fmt: skip
_TOKENIZER_CORE = ("tokenizer.json", "tokenizer.model", "vocab.json")
_OPTIONAL_TENSORS = {"lm_head.weight", "d2t", "t2d", "embed_tokens.weight", "fc.bias"}


@dataclass
class CheckpointPlan:
    """What inspect_checkpoint found; _write_engine needs nothing else."""

    target_config: dict
    target_weights: list[Path]
    target_extra_files: list[Path]
    tokenizer_files: list[Path]
    draft_weights: Path
    engine_draft_config: dict
    architecture: EagleArchitecture
    target_info: dict
    draft_info: dict


def inspect_checkpoint(cfg: EagleConfig, ckpt: Path) -> CheckpointPlan:
    """Check that ckpt (output of `eagle-trt convert`) exists, is complete and fits cfg."""
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint dir '{ckpt}' not found", hint="create it with `eagle-trt convert`")
    tdir, ddir = ckpt / "target", ckpt / "draft"
    for sub in (tdir, ddir):
        if not sub.is_dir():
            raise CheckpointError(
                f"checkpoint '{ckpt}' has no {sub.name}/ dir (is it `eagle-trt convert` output?)"
            )
    tcfg_path, dcfg_path = tdir / "config.json", ddir / "config.json"
    tcfg = _read_json(tcfg_path)
    H, L, V, P = (
        _int(tcfg, k, tcfg_path)
        for k in ("hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings")
    )
    target_weights = _target_shards(tdir, [V, H])
    tokenizer_files = [tdir / n for n in TOKENIZER_FILES if (tdir / n).is_file()]
    if not any(p.name in _TOKENIZER_CORE for p in tokenizer_files):
        raise CheckpointError(f"no tokenizer in '{tdir}' (expected one of {', '.join(_TOKENIZER_CORE)})")

    dcfg = _read_json(dcfg_path)
    dweights = ddir / "model.safetensors"
    if not dweights.is_file():
        raise CheckpointError(f"draft weights '{dweights}' not found")
    arch = _draft_architecture(dcfg, dcfg_path, P)
    heads_kv = _int(dcfg, "num_key_value_heads", dcfg_path, arch.num_attention_heads)
    head_dim = _int(dcfg, "head_dim", dcfg_path, arch.hidden_size // arch.num_attention_heads)
    if cfg.eagle_architecture is not None and cfg.eagle_architecture.hidden_size != H:
        raise ConfigError(
            f"eagle_architecture.hidden_size ({cfg.eagle_architecture.hidden_size}) does not match "
            f"hidden_size ({H}) of the target in '{tcfg_path}'"
        )
    if arch.hidden_size != H:
        raise CheckpointError(
            f"draft hidden_size ({arch.hidden_size}) in '{dcfg_path}' does not match the target "
            f"hidden_size ({H}) in '{tcfg_path}'"
        )
    if cfg.eagle_architecture is not None:
        pos_src = dcfg_path if "max_position_embeddings" in dcfg else tcfg_path
        for name, want in cfg.eagle_architecture.model_dump().items():
            have = getattr(arch, name)
            if want != have:
                src = pos_src if name == "max_position_embeddings" else dcfg_path
                raise ConfigError(
                    f"eagle_architecture.{name} ({want}) does not match {name} ({have}) in '{src}'"
                )

    if cfg.max_input_len + cfg.max_output_len > P:
        raise ConfigError(
            f"max_input_len ({cfg.max_input_len}) + max_output_len ({cfg.max_output_len}) = "
            f"{cfg.max_input_len + cfg.max_output_len} exceeds max_position_embeddings ({P}) "
            f"of the target in '{tcfg_path}'"
        )

    # `eagle-trt convert` writes the aux ids flat; modelopt's own export nests them in eagle_config.
    eagle_cfg = dict(dcfg.get("eagle_config") or {})
    aux = dcfg.get("eagle_aux_hidden_state_layer_ids") or eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
    aux = aux or sorted({1, max(0, L // 2 - 1), max(0, L - 4)})  # modelopt's EAGLE-3 default
    if not isinstance(aux, list) or not all(type(i) is int and 0 <= i < L for i in aux):
        raise CheckpointError(f"aux layer ids {aux} in '{dcfg_path}' are not layers of the {L}-layer target")
    raw = _shapes(dweights)
    # Official EAGLE-3 checkpoints call the decoder layer "midlayer"; check both layouts as one.
    key_map = {k: "layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k for k in raw}
    if len(set(key_map.values())) != len(key_map):
        raise CheckpointError(f"'{dweights}' has both midlayer.* and layers.0.* tensors")
    shapes = {key_map[k]: s for k, s in raw.items()}
    _check_draft_shapes(shapes, dweights, dcfg_path, arch, heads_kv, head_dim, len(aux))
    vocab = _check_draft_vocab(shapes, dcfg, dweights, dcfg_path, H, V)

    # The checkpoint's draft config as-is (rope, eps: nothing guessed), plus every resolved shape
    # field, so the runtime never has to re-derive a default differently from these checks.
    eagle_cfg["eagle_aux_hidden_state_layer_ids"] = aux
    engine_draft = {**dcfg, **arch.model_dump(), "num_key_value_heads": heads_kv, "head_dim": head_dim}
    engine_draft.update(vocab_size=V, draft_vocab_size=vocab, eagle_aux_hidden_state_layer_ids=aux)
    engine_draft["eagle_config"] = eagle_cfg
    return CheckpointPlan(
        target_config=tcfg,
        target_weights=target_weights,
        target_extra_files=[p for p in [tdir / "generation_config.json"] if p.is_file()],
        tokenizer_files=tokenizer_files,
        draft_weights=dweights,
        engine_draft_config=engine_draft,
        architecture=arch,
        target_info={
            "architecture": (tcfg.get("architectures") or [tcfg.get("model_type") or "unknown"])[0],
            "hidden_size": H,
            "num_layers": L,
            "vocab_size": V,
        },
        draft_info={"hidden_size": H, "draft_vocab_size": vocab, "aux_layer_ids": aux},
    )


def _draft_architecture(dcfg: dict, path: Path, target_positions: int) -> EagleArchitecture:
    return EagleArchitecture(
        hidden_size=_int(dcfg, "hidden_size", path),
        num_attention_heads=_int(dcfg, "num_attention_heads", path),
        intermediate_size=_int(dcfg, "intermediate_size", path),
        num_hidden_layers=_int(dcfg, "num_hidden_layers", path, 1),
        max_position_embeddings=_int(dcfg, "max_position_embeddings", path, target_positions),
    )


def _check_draft_shapes(shapes, path, cfg_path, arch, kv, head_dim, n_aux) -> None:
    """Every EAGLE-3 head tensor present with the shape the config implies, and nothing else."""
    H, I, q = arch.hidden_size, arch.intermediate_size, arch.num_attention_heads * head_dim
    layers = sorted({k.split(".")[1] for k in shapes if k.split(".")[0] == "layers"})
    # EAGLE-3 heads have one decoder layer, and that is all the torch runtime executes: a deeper
    # head would run with its extra layers silently skipped.
    if arch.num_hidden_layers != 1 or layers != ["0"]:
        raise CheckpointError(
            f"'{path}' has decoder layers {layers} and '{cfg_path}' says num_hidden_layers "
            f"{arch.num_hidden_layers}; only single-layer EAGLE-3 heads are supported"
        )
    # The layer reads [token embedding ; fused hidden] concatenated, hence 2*H-wide q/k/v inputs.
    want = {
        "fc.weight": [H, n_aux * H],
        "norm.weight": [H],
        "layers.0.self_attn.q_proj.weight": [q, 2 * H],
        "layers.0.self_attn.k_proj.weight": [kv * head_dim, 2 * H],
        "layers.0.self_attn.v_proj.weight": [kv * head_dim, 2 * H],
        "layers.0.self_attn.o_proj.weight": [H, q],
        "layers.0.mlp.gate_proj.weight": [I, H],
        "layers.0.mlp.up_proj.weight": [I, H],
        "layers.0.mlp.down_proj.weight": [H, I],
        "layers.0.input_layernorm.weight": [H],
        "layers.0.hidden_norm.weight": [H],
        "layers.0.post_attention_layernorm.weight": [H],
    }
    if "fc.bias" in shapes:
        want["fc.bias"] = [H]
    for key, shape in want.items():
        if key not in shapes:
            raise CheckpointError(
                f"'{path}' has no tensor {key} (expected EAGLE-3 layers.0.* or midlayer.* names)"
            )
        if shapes[key] != shape:
            raise CheckpointError(
                f"'{path}': {key} has shape {shapes[key]}, expected {shape} (hidden_size {H}, "
                f"{arch.num_attention_heads}x{head_dim} heads, {kv} kv heads, intermediate_size {I}, "
                f"{n_aux} aux layers)"
            )
    unknown = sorted(set(shapes) - set(want) - _OPTIONAL_TENSORS)
    if unknown:
        raise CheckpointError(f"'{path}' has unexpected tensors {unknown[:3]}: not an EAGLE-3 draft head")


def _check_draft_vocab(shapes, dcfg, path, cfg_path, H, V) -> int:
    """Draft vocab = lm_head rows; d2t (draft id -> target id offset) must stay inside the target vocab."""
    head = shapes.get("lm_head.weight")
    vocab = head[0] if head else V  # no lm_head: the draft reuses the target's
    if head is not None and (head[1] != H or vocab > V):
        raise CheckpointError(f"'{path}': lm_head.weight has shape {head}, expected [<= {V}, {H}]")
    if dcfg.get("draft_vocab_size", vocab) != vocab:
        raise CheckpointError(
            f"draft_vocab_size ({dcfg['draft_vocab_size']}) in '{cfg_path}' does not match "
            f"lm_head.weight rows ({vocab}) in '{path}'"
        )
    if "d2t" not in shapes:
        if vocab != V:
            raise CheckpointError(f"'{path}' has a {vocab}-token draft vocab (target: {V}) but no d2t map")
        return vocab
    if shapes["d2t"] != [vocab]:
        raise CheckpointError(f"'{path}': d2t has shape {shapes['d2t']}, expected [{vocab}]")
    import torch
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        d2t = fh.get_tensor("d2t")
    ids = torch.arange(vocab) + d2t.long()
    if d2t.is_floating_point() or int(ids.min()) < 0 or int(ids.max()) >= V:
        raise CheckpointError(f"'{path}': d2t maps draft ids outside the target vocab [0, {V})")
    return vocab


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"'{path}' not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read '{path}': {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"'{path}' must hold a JSON object")
    return data


def _int(data: dict, key: str, path: Path, default: int | None = None) -> int:
    value = data.get(key)
    if value is None:
        value = default  # absent or null ("head_dim": null is common)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"'{path}' needs a positive integer {key} (got {value!r})")
    return value


def _target_shards(tdir: Path, embed_shape: list[int]) -> list[Path]:
    """The target's safetensors file(s); each header must parse and the embedding must fit."""
    index = tdir / "model.safetensors.index.json"
    if (tdir / "model.safetensors").is_file():
        shards = [tdir / "model.safetensors"]
    elif index.is_file():
        shards = sorted({tdir / name for name in _read_json(index).get("weight_map", {}).values()})
        if not shards:
            raise CheckpointError(f"'{index}' has an empty weight_map")
    else:
        raise CheckpointError(
            f"no weights in '{tdir}' (expected model.safetensors or model.safetensors.index.json)"
        )
    for shard in shards:
        if not shard.is_file():
            raise CheckpointError(f"weight shard '{shard}' not found")
        emb = _shapes(shard).get("model.embed_tokens.weight")
        if emb is not None and emb != embed_shape:
            raise CheckpointError(
                f"'{shard}': model.embed_tokens.weight has shape {emb} but '{tdir / 'config.json'}' "
                f"implies {embed_shape} (vocab_size, hidden_size)"
            )
    return shards


def _shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes from the safetensors header only (no weights are read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as fh:
            return {k: list(fh.get_slice(k).get_shape()) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"'{path}' is not a readable safetensors file: {exc}") from exc
