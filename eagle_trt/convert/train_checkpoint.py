"""The training checkpoint: atomic, resumable save/load of the head, its optimizer and the RNG.

One safetensors file, replaced atomically (written to a temp file, fsynced, then renamed), so a crash
or Ctrl-C mid-save leaves the previous checkpoint intact:
    head.<name>              eagle_module state (weights + d2t)
    optim.<i>.<state>        AdamW state of trainable parameter i (exp_avg, exp_avg_sq, step)
    rng.torch                torch CPU generator state
    metadata: format, step (global), config (JSON), params (names, in optimizer order), param_groups, history,
              extra (samples seen, the world size that wrote it)

Under torch.distributed every rank holds the same head and optimizer state (DDP averages the gradients before each
step), so rank 0 alone writes it and any world size can resume from it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_trt.errors import CheckpointError

CHECKPOINT_FORMAT = "eagle-trt-train-checkpoint/1"


def _trainable(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.eagle_module.named_parameters() if p.requires_grad]


def save_checkpoint(path: str | Path, model, optimizer, step: int, config: dict, history: list[dict],
                    extra: dict | None = None) -> Path:
    """Write the checkpoint atomically: a crash or Ctrl-C leaves the previous one intact. `step` is the global step
    (optimizer steps over global batches), the only position a resume needs, whatever world size wrote it; `extra`
    (JSON-able: samples seen, the world size that wrote it) is informational."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"head.{k}": v.detach().contiguous().clone() for k, v in model.eagle_module.state_dict().items()}
    sd = optimizer.state_dict()
    for i, state in sd["state"].items():
        for k, v in state.items():
            tensors[f"optim.{i}.{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().contiguous().clone()
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {
        "format": CHECKPOINT_FORMAT,
        "step": str(step),
        "config": json.dumps(config, sort_keys=True),
        "params": json.dumps([n for n, _ in _trainable(model)]),
        "param_groups": json.dumps(sd["param_groups"]),
        "history": json.dumps(history),
        "extra": json.dumps(extra or {}),
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, metadata with step/config/params/param_groups/history decoded)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no training checkpoint to resume from") from None
    except Exception as e:
        raise CheckpointError(f"{path}: unreadable training checkpoint ({e})") from None
    if raw.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not an eagle-trt training checkpoint")
    meta = {"step": int(raw["step"])}
    for k in ("config", "params", "param_groups", "history"):
        meta[k] = json.loads(raw[k])
    meta["extra"] = json.loads(raw.get("extra", "{}"))
    return tensors, meta


def load_checkpoint(path: str | Path, model, optimizer) -> dict:
    """Restore head weights, optimizer state and RNG; return the metadata."""
    tensors, meta = read_checkpoint(path)
    names = [n for n, _ in _trainable(model)]
    if meta["params"] != names:
        raise CheckpointError(f"{path}: checkpoint holds a different head (parameters differ)")
    head = {k[5:]: v for k, v in tensors.items() if k.startswith("head.")}
    try:
        model.eagle_module.load_state_dict(head, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: head weights do not fit this head ({str(e).splitlines()[0]})") from None
    state: dict[int, dict] = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, i, name = k.split(".", 2)
            state.setdefault(int(i), {})[name] = v
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    torch.set_rng_state(tensors["rng.torch"])
    return meta


__all__ = ["CHECKPOINT_FORMAT", "save_checkpoint", "read_checkpoint", "load_checkpoint"]
