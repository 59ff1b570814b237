"""The on-disk feature cache for offline head training: the target's aux hidden states, run once.

Owns building the cache (one plain HF forward over the training sequences, with hooks on the aux
layers), the layout on disk and its validity check, and reading padded batches back for training.

    from eagle_trt.convert.feature_cache import build_feature_cache, load_feature_cache
    cache = load_feature_cache("/tmp/work/cache", key)          # None unless complete and built for key
    cache = cache or build_feature_cache(model, sequences, aux_layer_ids, "/tmp/work/cache", key)
    batch = cache.batch([0, 3, 5])   # input_ids / attention_mask [B, L], aux / hidden [B, L, *] float32

Cache layout (CACHE = the work dir's `cache/`):
    CACHE/shard-00000.safetensors   input_ids [N] int32, aux [N, n_aux*H], hidden [N, H] (bfloat16 by
                                     default), offsets [S+1] int64: sequence j is rows offsets[j]:offsets[j+1];
                                     shard-r<rank>-00000... when several ranks wrote it (rank order = sequence order)
    CACHE/counts.safetensors        predicted [V], seen [V] int64: target argmax / data token counts
    CACHE/meta.json                 written last; the cache is valid only if it exists and its key matches
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .data import _progress
from .distributed import World, rank_span

CACHE_FORMAT = "eagle-trt-feature-cache/1"
SHARD_TOKENS = 1 << 16


class FeatureCache:
    """Read side of the cache: padded training batches by sequence index."""

    def __init__(self, cache_dir: str | Path):
        self.dir = Path(cache_dir)
        self.meta = json.loads((self.dir / "meta.json").read_text())
        self._files = [safe_open(str(self.dir / name), framework="pt") for name in self.meta["shards"]]
        self._index: list[tuple[int, int, int]] = []  # (shard, start, end)
        for s, f in enumerate(self._files):
            off = f.get_tensor("offsets").tolist()
            self._index += [(s, off[j], off[j + 1]) for j in range(len(off) - 1)]
        counts = load_file(str(self.dir / "counts.safetensors"))
        self.predicted_counts, self.seen_counts = counts["predicted"], counts["seen"]

    def __len__(self) -> int:
        return len(self._index)

    @property
    def key(self) -> str:
        return self.meta["key"]

    def length(self, i: int) -> int:
        _, a, b = self._index[i]
        return b - a

    def sequence(self, i: int) -> dict[str, torch.Tensor]:
        s, a, b = self._index[i]
        f = self._files[s]
        return {name: f.get_slice(name)[a:b] for name in ("input_ids", "aux", "hidden")}

    def batch(self, indices: list[int], pad_id: int = 0, device: torch.device | str | None = None
              ) -> dict[str, torch.Tensor]:
        """Right-padded [B, L] ids / mask and [B, L, *] float32 features (L = longest in the batch).

        The features are padded in their stored dtype and widened to float32 on `device` (default:
        the CPU), so a GPU run moves half the bytes and converts them there."""
        seqs = [self.sequence(i) for i in indices]
        width = max(s["input_ids"].shape[0] for s in seqs)
        b = len(seqs)
        ids = torch.full((b, width), pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        aux = torch.zeros((b, width, seqs[0]["aux"].shape[-1]), dtype=seqs[0]["aux"].dtype)
        hidden = torch.zeros((b, width, seqs[0]["hidden"].shape[-1]), dtype=seqs[0]["hidden"].dtype)
        for r, s in enumerate(seqs):
            n = s["input_ids"].shape[0]
            ids[r, :n], mask[r, :n] = s["input_ids"].long(), 1
            aux[r, :n], hidden[r, :n] = s["aux"], s["hidden"]
        out = {"input_ids": ids, "attention_mask": mask, "aux": aux, "hidden": hidden}
        if device is not None and torch.device(device).type != "cpu":
            out = {k: v.to(device, non_blocking=True) for k, v in out.items()}
        out["aux"], out["hidden"] = out["aux"].float(), out["hidden"].float()
        return out


def load_feature_cache(cache_dir: str | Path, key: str) -> FeatureCache | None:
    """The cache in cache_dir if it is complete and was built for `key`, else None."""
    meta = Path(cache_dir) / "meta.json"
    try:
        data = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if data.get("format") != CACHE_FORMAT or data.get("key") != key:
        return None
    try:
        return FeatureCache(cache_dir)
    except Exception:  # a shard went missing or is damaged: rebuild
        return None


def _write_atomic_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def build_feature_cache(model, sequences: list[list[int]], aux_layer_ids: list[int], cache_dir: str | Path,
                        key: str, batch_size: int = 4, dtype: torch.dtype = torch.bfloat16,
                        progress: bool = True, world: World = World(), source=None) -> FeatureCache:
    """Run the target once over `sequences` and write the cache (see the module doc): the plain HF `model`, or
    `source` where given (an object with `features(seqs)` -> per sequence (aux, hidden, greedy tokens), as
    `engine_features.EngineSource` computes them with a built engine's kernels).

    Under torchrun every rank calls this with the same sequences: the length-sorted order is cut into one
    contiguous span per rank (about equal tokens each), every rank writes its own shards and counts, and rank 0
    joins them (counts summed, meta.json listing the shards in rank order: the same sequence order as one process
    writes) once all have finished; meta.json, written last and atomically, is what makes the cache valid."""
    cache_dir = Path(cache_dir)
    if world.is_main:
        if cache_dir.exists():
            shutil.rmtree(cache_dir)
        cache_dir.mkdir(parents=True)
    world.barrier()
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # little padding per batch
    start, end = rank_span([len(sequences[i]) for i in order], world.rank, world.size)
    prefix = f"shard-r{world.rank:03d}-" if world.active else "shard-"
    mine = [sequences[i] for i in order[start:end]]
    source = source or HFSource(model, aux_layer_ids)
    shards, predicted, seen = _run_target(source, model.config.vocab_size, mine, cache_dir, prefix, batch_size, dtype,
                                          progress)
    if world.active:
        save_file({"predicted": predicted, "seen": seen}, str(cache_dir / f".part-r{world.rank:03d}.safetensors"),
                  metadata={"shards": json.dumps(shards)})
    world.barrier()
    if world.is_main:
        if world.active:
            shards, predicted, seen = _join_parts(cache_dir, world.size)
        save_file({"predicted": predicted, "seen": seen}, str(cache_dir / "counts.safetensors"))
        _write_atomic_json(cache_dir / "meta.json", {
            "format": CACHE_FORMAT, "key": key, "shards": shards, "sequences": len(sequences),
            "tokens": int(seen.sum()), "aux_layer_ids": sorted(aux_layer_ids),
            "dtype": str(dtype).replace("torch.", ""), "hidden_size": model.config.hidden_size,
            "vocab_size": model.config.vocab_size, "computed_by": source.name,
        })
    world.barrier()
    return FeatureCache(cache_dir)


def _join_parts(cache_dir: Path, size: int) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The ranks' shard lists in rank order and their counts summed; the part files removed."""
    shards: list[str] = []
    predicted = seen = None
    for r in range(size):
        part = cache_dir / f".part-r{r:03d}.safetensors"
        with safe_open(str(part), framework="pt") as f:
            shards += json.loads(f.metadata()["shards"])
            p, s = f.get_tensor("predicted"), f.get_tensor("seen")
        predicted, seen = (p, s) if predicted is None else (predicted + p, seen + s)
        part.unlink()
    return shards, predicted, seen


class HFSource:
    """The features from the plain HF target: one padded forward a batch, hooks on the aux layers, the LM head's
    argmax per row."""

    name = "transformers"

    def __init__(self, model, aux_layer_ids: list[int]):
        self.model, self.aux_layer_ids = model, sorted(aux_layer_ids)

    def features(self, seqs: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        model = self.model
        base, device = model.model, next(model.parameters()).device
        caught: dict[int, torch.Tensor] = {}
        hooks = [base.layers[i].register_forward_hook(
            lambda _m, _a, out, i=i: caught.__setitem__(i, out if torch.is_tensor(out) else out[0]))
            for i in self.aux_layer_ids]
        try:
            ids, mask = _padded(seqs)
            hidden = base(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state  # post norm
            aux = torch.cat([caught[i] for i in self.aux_layer_ids], dim=-1)
        finally:
            for h in hooks:
                h.remove()
        return [(aux[r, :len(q)], hidden[r, :len(q)], model.lm_head(hidden[r, :len(q)]).argmax(-1))
                for r, q in enumerate(seqs)]


def _run_target(source, vocab: int, sequences: list[list[int]], cache_dir: Path, prefix: str, batch_size: int,
                dtype: torch.dtype, progress: bool) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The target over `sequences` in their order, batch by batch (`source.features`), the features written as
    shards named prefix + index. Returns (shard names, target-argmax counts, data token counts)."""
    predicted = torch.zeros(vocab, dtype=torch.long)
    seen = torch.zeros(vocab, dtype=torch.long)
    shards: list[str] = []
    pending: list[dict[str, torch.Tensor]] = []
    model = getattr(source, "model", None)
    was_training = model.training if model is not None else False
    if model is not None:
        model.eval()
    try:
        with _progress(progress, "Caching target features", len(sequences)) as (bar, task), torch.inference_mode():
            pending_tokens = 0
            for b in range(0, len(sequences), batch_size):
                seqs = sequences[b:b + batch_size]
                for q, (aux, hidden, preds) in zip(seqs, source.features(seqs)):
                    ids = torch.tensor(q, dtype=torch.long)
                    predicted += torch.bincount(preds.cpu(), minlength=vocab)[:vocab]
                    seen += torch.bincount(ids, minlength=vocab)[:vocab]
                    pending.append({"input_ids": ids, "aux": aux.to(dtype).cpu(), "hidden": hidden.to(dtype).cpu()})
                    pending_tokens += len(q)
                if pending_tokens >= SHARD_TOKENS:
                    _write_shard(cache_dir, pending, shards, prefix)
                    pending_tokens = 0
                if bar is not None:
                    bar.advance(task, len(seqs))
        _write_shard(cache_dir, pending, shards, prefix)
    finally:
        if model is not None:
            model.train(was_training)
    return shards, predicted, seen


def _padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids right-padded with zeros to the longest, and the attention mask."""
    width = max(len(q) for q in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, q in enumerate(seqs):
        ids[r, :len(q)], mask[r, :len(q)] = torch.tensor(q), 1
    return ids, mask


def _write_shard(cache_dir: Path, pending: list[dict[str, torch.Tensor]], shards: list[str], prefix: str) -> None:
    """The pending sequences as the next shard (concatenated, with their offsets); appends its name, empties
    pending."""
    if not pending:
        return
    lengths = [p["input_ids"].shape[0] for p in pending]
    offsets = torch.tensor([0] + lengths).cumsum(0)
    name = f"{prefix}{len(shards):05d}.safetensors"
    save_file({
        "input_ids": torch.cat([p["input_ids"] for p in pending]).to(torch.int32),
        "aux": torch.cat([p["aux"] for p in pending]).contiguous(),
        "hidden": torch.cat([p["hidden"] for p in pending]).contiguous(),
        "offsets": offsets.to(torch.int64),
    }, str(cache_dir / name))
    shards.append(name)
    pending.clear()


__all__ = ["CACHE_FORMAT", "SHARD_TOKENS", "FeatureCache", "HFSource", "build_feature_cache", "load_feature_cache"]
