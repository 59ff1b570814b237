"""Train the EAGLE-3 head offline: cache the target's features once, then fit the head on the cache.

    from eagle_trt.convert.train import FeatureCache, TrainConfig, build_feature_cache, train_head
    cache = build_feature_cache(model, sequences, aux_layer_ids, "/tmp/work/cache", key="...")
    model = attach_eagle3(model, draft_vocab_size)           # modelopt EAGLE-3 head on the target
    result = train_head(model, cache, TrainConfig(steps=200), "/tmp/work/checkpoint.safetensors")

The loss is modelopt's own: `HFEagleModel.forward` in offline mode (`eagle_offline`, inputs given as
`base_model_outputs`: the concatenated aux layer outputs and the target's final post-norm hidden
state, from which modelopt recomputes the target logits with the target's lm_head). That is its
EAGLE-3 training-time-test loop (`eagle_ttt_steps` unrolled draft steps, each attending to its own
earlier predictions) with a soft cross-entropy against the target's distribution restricted to
the draft vocab, decayed by 0.9 per step, and top-1 accuracy against the target's argmax.

Under torchrun every rank runs `train_head` with its `World` (`distributed.py`): each global batch is split over
the ranks and the head wrapped in DDP (`train_ddp.py`), rank 0 alone writes the checkpoint, and a stop asked on any
rank stops them all after the same step. One process runs the same loop with no collective.

This module owns the training loop: `TrainConfig` (schedule and validation), the seeded batch order,
Ctrl-C handling, `train_head` and its `TrainResult` summary. The feature cache (layout, build, read)
lives in `feature_cache.py`; the atomic resumable checkpoint in `train_checkpoint.py`. Their public
names are re-exported here.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from eagle_trt.errors import InputError
from eagle_trt.staging import Terminated

from .distributed import World
from .feature_cache import (CACHE_FORMAT, SHARD_TOKENS, FeatureCache, build_feature_cache,  # noqa: F401
                            load_feature_cache)
from .train_checkpoint import (CHECKPOINT_FORMAT, _trainable, load_checkpoint, read_checkpoint,  # noqa: F401
                               save_checkpoint)
from .train_ddp import StepShare, wrap_ddp


# ---- training --------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    steps: int | None = None  # total optimizer steps; or
    epochs: float | None = None  # passes over the cache
    batch_size: int = 4
    lr: float = 3e-4
    warmup_steps: int | None = None  # default: 5% of the steps (at least 1)
    min_lr_ratio: float = 0.1  # cosine decay down to lr * min_lr_ratio
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ttt_steps: int = 3
    checkpoint_every: int = 50
    seed: int = 0

    def validate(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise InputError("give exactly one of --steps or --epochs for training")
        if self.steps is not None and self.steps < 1:
            raise InputError(f"--steps must be >= 1 for training; got {self.steps}")
        if self.epochs is not None and not self.epochs > 0:
            raise InputError(f"--epochs must be > 0; got {self.epochs}")
        for name in ("batch_size", "ttt_steps", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}")
        if not self.lr > 0:
            raise InputError(f"--lr must be > 0; got {self.lr}")

    def steps_per_epoch(self, n_sequences: int) -> int:
        return math.ceil(n_sequences / self.batch_size)

    def total_steps(self, n_sequences: int) -> int:
        if self.steps is not None:
            return self.steps
        return max(1, math.ceil(self.epochs * self.steps_per_epoch(n_sequences)))

    def lr_at(self, step: int, total: int) -> float:
        """Linear warmup, then cosine decay to lr * min_lr_ratio (step is 0-based)."""
        warm = self.warmup_steps if self.warmup_steps is not None else max(1, round(0.05 * total))
        if step < warm:
            return self.lr * (step + 1) / warm
        frac = (step - warm) / max(1, total - warm)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


@dataclass
class TrainResult:
    steps: int  # optimizer steps done in total (including resumed ones)
    total_steps: int
    history: list[dict] = field(default_factory=list)  # per step: step, loss, acc (per TTT step), lr
    resumed_from: int = 0
    seconds: float = 0.0  # wall time of this run's steps
    interrupted: bool = False

    def summary(self, last: int = 20) -> dict:
        tail = self.history[-last:]
        mean = lambda xs: round(sum(xs) / len(xs), 4) if xs else None  # noqa: E731
        done_here = self.steps - self.resumed_from
        return {
            "steps": self.steps,
            "total_steps": self.total_steps,
            "resumed_from": self.resumed_from,
            "seconds": round(self.seconds, 1),
            "s_per_step": round(self.seconds / done_here, 3) if done_here else None,
            "first_loss": round(self.history[0]["loss"], 4) if self.history else None,
            f"loss_last{last}": mean([h["loss"] for h in tail]),
            f"acc_last{last}": [mean([h["acc"][k] for h in tail]) for k in range(len(tail[0]["acc"]))] if tail else [],
        }


def batch_order(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The batches of one epoch: a seeded permutation, so any step can be recomputed on resume."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    return [perm[i:i + batch_size] for i in range(0, n, batch_size)]


# ---- Ctrl-C ------------------------------------------------------------------------------------------
class _StopRequest:
    """First Ctrl-C or SIGTERM: finish the current step, save, stop. A second one aborts at once."""

    def __init__(self, console=None):
        self.requested = False
        self.signum = signal.SIGINT  # what asked to stop
        self.console = console
        self._previous = None

    def _handler(self, signum, frame):
        if self.requested:
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt
        self.requested, self.signum = True, signum
        if self.console is not None:
            name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
            self.console.print(f"[yellow]{name}: finishing this step and saving a checkpoint "
                               "(press Ctrl-C again to abort without saving)[/]")

    def __enter__(self):
        # SIGTERM (a CI job cancelled, `docker stop`) saves the checkpoint like a Ctrl-C.
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for sig, previous in (self._previous or {}).items():
            signal.signal(sig, previous)
        return False


class TrainingInterrupted(KeyboardInterrupt):
    """Raised after a Ctrl-C or SIGTERM (or a callback's KeyboardInterrupt) once the checkpoint is saved; exit_code
    is what the CLI exits with (130 for SIGINT, 143 for SIGTERM, as the shell reports a signal)."""

    def __init__(self, step: int, checkpoint: Path, signum: int = signal.SIGINT):
        super().__init__(f"training interrupted after step {step}; checkpoint saved to {checkpoint}; "
                         "run again with resume to continue")
        self.step, self.checkpoint, self.exit_code = step, checkpoint, 128 + signum


# ---- the loop ------------------------------------------------------------------------------------------
def _train_bar(enabled: bool):
    if not enabled:
        return None
    return Progress(
        TextColumn("Training head"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss [bold]{task.fields[loss]:.3f}[/] top-1 [bold]{task.fields[acc]:.1%}[/]"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=Console(stderr=True),
    )


def train_head(model, cache: FeatureCache, cfg: TrainConfig, checkpoint_path: str | Path, resume: bool = False,
               progress: bool = True, on_step: Callable[[dict], None] | None = None,
               run_config: dict | None = None, world: World = World()) -> TrainResult:
    """Train model.eagle_module on the cache; returns the history. See the module doc.

    `on_step(info)` runs after every optimizer step (info: step, loss, acc, lr); a KeyboardInterrupt
    raised there counts as Ctrl-C: the finished step is checkpointed, then TrainingInterrupted is raised.
    `run_config` (JSON-able) is stored in the checkpoint and must match on resume.

    Under torchrun (`world` of several ranks) every rank runs this with the same cache and config: each step's
    global batch of cfg.batch_size sequences is split over the ranks (`train_ddp.py`), the gradients are averaged
    by DDP, and rank 0 alone writes the checkpoint. A stop asked on any rank stops all of them after the same step."""
    cfg.validate()
    checkpoint_path = Path(checkpoint_path)
    n = len(cache)
    total = cfg.total_steps(n)
    config = {"cache_key": cache.key, "batch_size": cfg.batch_size, "ttt_steps": cfg.ttt_steps, "seed": cfg.seed,
              **(run_config or {})}

    _offline_mode(model, cfg)
    params = [p for _, p in _trainable(model)]
    device = params[0].device  # the caller placed the model; batches follow it
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, history = _resumed(checkpoint_path, model, optimizer, config) if resume else (0, [])
    result = TrainResult(step, total, history, step)
    # Built after the resume: DDP's start broadcasts rank 0's head (the same bytes, read from the same checkpoint).
    ddp = wrap_ddp(model, world, device)
    bar = _train_bar(progress)
    loop = _Loop(model, ddp, cache, cfg, optimizer, params, world, total)

    def checkpoint():
        if world.is_main:
            save_checkpoint(checkpoint_path, model, optimizer, result.steps, config, history,
                            extra={"samples_seen": samples_seen(n, cfg.batch_size, result.steps),
                                   "world_size": world.size})

    model.train()
    t0 = time.perf_counter()
    try:
        with _StopRequest(bar.console if bar is not None else None) as stop, (bar if bar is not None else _Null()):
            task = bar.add_task("train", total=total, completed=step, loss=float("nan"), acc=0.0) if bar else None
            while result.steps < total:
                record, signum = loop.step(result.steps, stop)
                history.append(record)
                result.steps = record["step"]
                if bar is not None:
                    bar.update(task, completed=result.steps, **loop.ema(record))
                if on_step is not None:
                    try:
                        on_step(dict(record))
                    except KeyboardInterrupt:
                        stop.requested = True
                # Across ranks only the reduced answer decides (a request that came after it is seen next step), so
                # every rank stops after the same step; one process stops at once.
                if signum or (stop.requested and not world.active):
                    checkpoint()
                    world.barrier()  # no rank exits (and makes torchrun stop the others) before rank 0 has saved
                    result.interrupted = True
                    raise TrainingInterrupted(result.steps, checkpoint_path, signum or stop.signum)
                if result.steps % cfg.checkpoint_every == 0 or result.steps == total:
                    checkpoint()
    finally:
        result.seconds = time.perf_counter() - t0
        model.eval()
        model._cached_attn_blk_masks = {}
    return result


def samples_seen(n: int, batch_size: int, step: int) -> int:
    """Sequences trained on after `step` global steps (the epoch's last batch may be short)."""
    per_epoch = math.ceil(n / batch_size)
    epochs, pos = divmod(step, per_epoch)
    return epochs * n + min(pos * batch_size, n)


class _Loop:
    """The steps of train_head: the global batch of a step (a function of the step alone), this rank's share, the
    optimizer step, and the figures every rank agrees on."""

    def __init__(self, model, ddp, cache, cfg: TrainConfig, optimizer, params, world: World, total: int):
        self.model, self.ddp, self.cache, self.cfg = model, ddp, cache, cfg
        self.optimizer, self.params, self.world, self.total = optimizer, params, world, total
        self.device = params[0].device
        self.spe = cfg.steps_per_epoch(len(cache))
        self.last_width = None
        self._ema = None

    def step(self, step: int, stop: "_StopRequest") -> tuple[dict, int]:
        """Run global step `step` (0-based); (its record, the signal that asks every rank to stop, or 0)."""
        epoch, pos = divmod(step, self.spe)
        share = StepShare.of(batch_order(len(self.cache), self.cfg.batch_size, self.cfg.seed, epoch)[pos],
                             self.cache.length, self.world, self.cfg.ttt_steps)
        batch = self.cache.batch(share.indices, device=self.device)
        if batch["input_ids"].shape[1] != self.last_width:
            # modelopt caches the TTT attention masks per step index, built for one length.
            self.model._cached_attn_blk_masks = {}
            self.last_width = batch["input_ids"].shape[1]
        lr = self.cfg.lr_at(step, self.total)
        with share.weighting(self.model):
            loss, acc = _optimizer_step(self.ddp, batch, self.optimizer, self.params, self.cfg.grad_clip, lr, step)
        asked = stop.requested
        flags = [int(asked and stop.signum == signal.SIGTERM), int(asked and stop.signum != signal.SIGTERM)]
        loss, acc, (terms, ints) = share.reduce(loss, acc, flags)
        signum = signal.SIGTERM if terms else signal.SIGINT if ints else 0
        record = {"step": step + 1, "loss": round(loss, 5), "acc": [round(a, 4) for a in acc], "lr": lr}
        return record, signum

    def ema(self, record: dict) -> dict:
        prev = self._ema
        self._ema = {"loss": record["loss"], "acc": record["acc"][0]} if prev is None else {
            "loss": 0.9 * prev["loss"] + 0.1 * record["loss"], "acc": 0.9 * prev["acc"] + 0.1 * record["acc"][0]}
        return self._ema


def _offline_mode(model, cfg: TrainConfig) -> None:
    """modelopt's EAGLE model set to train from cached features (no target forward), with cfg's TTT steps."""
    model.eagle_offline = True  # take the features from base_model_outputs, not from a target forward
    model.eagle_ttt_steps = cfg.ttt_steps
    model.eagle_mix_hidden_states = False
    base_cfg = model._base_llm_config
    if not isinstance(getattr(base_cfg, "dtype", None), torch.dtype):
        # save_pretrained leaves config.dtype as a string; modelopt's TTT masks call torch.finfo on it.
        base_cfg.dtype = next(model.eagle_module.parameters()).dtype


def _resumed(checkpoint_path: Path, model, optimizer, config: dict) -> tuple[int, list]:
    """(step, history) of the checkpoint at checkpoint_path, loaded into model and optimizer, if there is one and
    it was trained with the same config; (0, []) without one."""
    if not checkpoint_path.is_file():
        return 0, []
    meta = load_checkpoint(checkpoint_path, model, optimizer)
    diff = sorted(k for k in set(config) | set(meta["config"]) if config.get(k) != meta["config"].get(k))
    if diff:
        raise InputError(f"cannot resume from {checkpoint_path}: it was trained with different settings "
                         f"({', '.join(diff)}); rerun with the same options or without resume")
    return meta["step"], meta["history"]


def _optimizer_step(model, batch: dict, optimizer, params: list, grad_clip: float, lr: float, step: int
                    ) -> tuple[float, list[float]]:
    """One optimizer step at learning rate lr on a batch of cached features: (loss, top-1 accuracy per TTT step)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                loss_mask=batch["attention_mask"],
                base_model_outputs={"aux_hidden_states": batch["aux"], "base_model_hidden_states": batch["hidden"]})
    loss = out.loss
    if not torch.isfinite(loss):
        raise RuntimeError(f"training diverged at step {step + 1} (loss {loss.item()}); lower --lr")
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item(), [float(a) for a in out.train_acc[0]]


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_config_dict(**kw) -> dict:
    """Normalise settings for the checkpoint's config check (JSON types only)."""
    return json.loads(json.dumps(kw, default=str))


__all__ = ["FeatureCache", "TrainConfig", "TrainResult", "TrainingInterrupted", "build_feature_cache",
           "load_feature_cache", "train_head", "save_checkpoint", "load_checkpoint", "read_checkpoint",
           "batch_order", "samples_seen"]
