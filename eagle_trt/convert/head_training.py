"""The head-training half of `convert`: the dataset (cached in the work dir), the target's feature cache, the draft
vocabulary, modelopt's head attached and trained, then exported (`pipeline.py` runs these steps)."""

from __future__ import annotations

import gc
import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import torch

from eagle_trt.engine.datastore_file import DATASTORE_NAME, write_datastore
from eagle_trt.errors import InputError

from .attach import attach_eagle3, default_aux_layer_ids
from .data import Dataset, build_dataset
from .device import training_matmul
from .distributed import World
from .draft_vocab import d2t_from_vocab, load_d2t, ranking, select_draft_vocab
from .export import write_draft
from .regen_endpoint import PROGRESS_NAME, EndpointRegenerator
from .stages import Stages
from .engine_features import EngineSource
from .train import build_feature_cache, load_feature_cache, run_config_dict, train_head


DATASET_FORMAT = "eagle-trt-dataset/1"


def _file_stamp(path: Path) -> list:
    st = path.stat()
    return [str(path), st.st_size, st.st_mtime_ns]


def _source_stamp(path: Path) -> list:
    """Identity of the target weights (path, sizes, mtimes) for the work-dir cache keys."""
    path = Path(path)
    if path.is_file():
        return _file_stamp(path)
    return [_file_stamp(p) for p in sorted(path.glob("*.safetensors")) + [path / "config.json"] if p.is_file()]


def _data_key(model_path, data, **settings) -> str:
    specs = []
    for spec in data:
        p = Path(spec).expanduser()
        specs.append(_file_stamp(p.resolve()) if p.is_file() else str(spec).lower())
    blob = json.dumps({"format": DATASET_FORMAT, "target": _source_stamp(Path(model_path).expanduser().resolve()),
                       "data": specs, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _load_or_build_dataset(work: Path, key: str, build: Callable):
    path = work / "dataset.json"
    try:
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return Dataset(saved["sequences"], saved["val_prompts"], saved["stats"]), True
    except (OSError, json.JSONDecodeError, KeyError):
        pass
    ds = build()
    work.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "sequences": ds.sequences, "val_prompts": ds.val_prompts,
                               "stats": ds.stats}))
    os.replace(tmp, path)
    return ds, False


# Sequences an engine forward takes at once: hundreds of rows, so each weight pass serves many of them.
ENGINE_BATCH = 8


def _drop_target_layers(model) -> None:
    """Offline training reads the target's embeddings, final norm and LM head only (its layers' outputs come from
    the feature cache, and OUT/target was written before the head was attached): the decoder layers are released,
    so a rank holds the head, its optimizer and those few target tensors, not the whole target."""
    base = getattr(model, "model", None)
    if isinstance(getattr(base, "layers", None), torch.nn.ModuleList):
        base.layers = torch.nn.ModuleList()
        gc.collect()


def _made_by_rank_0(work: Path) -> Callable:
    def fail():
        raise InputError(f"{work / 'dataset.json'}: rank 0 made no dataset this rank can read; every rank needs the "
                         "same work dir (--work-dir on a filesystem all nodes share)")
    return fail


def attach_and_train(model, tokenizer, info, stage: Path | None, stages: Stages, work: Path, train: dict | None,
                     draft_vocab_size: int | None, eos: list[int], intermediate_size: int | None = None
                     ) -> tuple[dict, dict, list]:
    """Attach the EAGLE-3 head with modelopt, train it if `train` (the training options) says so, export it to
    stage/draft. Returns (draft config, training summary ({} untrained), held-out prompt ids).

    Under torchrun (train["world"] of several ranks) every rank runs the data, cache and training stages inside the
    process group; only rank 0 has a `stage` and exports, the others return ({}, {}, []) once training ends."""
    training: dict = {}
    dataset = d2t = cache = result = None
    world = train["world"] if train else World()
    if train:
        model.to(train["run_on"])  # regeneration and the feature cache run where the training will
    with world.joined(train["run_on"] if train else None):
        if train:
            dataset, d2t, cache = _prepare_training(
                model, tokenizer, info, train["data"], work, stages, train["progress"], seq_len=train["seq_len"],
                batch_size=train["batch_size"], regenerate=train["regenerate"],
                max_new_tokens=train["max_new_tokens"], val_prompts=train["val_prompts"],
                draft_vocab_size=draft_vocab_size, eos=eos, world=world,
                endpoint=train.get("endpoint"), precision=train.get("precision", torch.float32),
                features_from=train.get("features_from"))
        with stages.stage("attach", "Attaching EAGLE-3 head (modelopt)"):
            # On the CPU: the head's seeded initialisation is then the same whatever device trains it.
            model = attach_eagle3(model.cpu(), draft_vocab_size, intermediate_size=intermediate_size)
            if train and train.get("init_head") is not None:  # its d2t, not one picked from this data
                d2t = train["init_head"].load_into(model)
        if train:
            model, result, run_config = _train(model, cache, d2t, info, train, work, stages, world)
    if stage is None:
        return {}, {}, []
    if train:
        training = {"data": dataset.stats, "config": {**run_config, "batch_size": train["batch_size"],
                                                      "ttt_steps": train["ttt_steps"], "seed": train["seed"],
                                                      "regenerate": train["regenerate"],
                                                      **_init_summary(train.get("init_head")),
                                                      "device": str(train["run_on"]), "world_size": world.size,
                                                      "precision": str(train.get("precision", torch.float32))
                                                      .replace("torch.", ""),
                                                      **_endpoint_summary(train.get("endpoint"))},
                    **result.summary()}
    with stages.stage("export_draft", "Writing draft head"):
        draft_config = write_draft(model, stage / "draft")
        if train:  # the training text doubles as the head's prompt-lookup datastore
            training["datastore_tokens"] = write_datastore(stage / "draft" / DATASTORE_NAME, dataset.sequences)
    return draft_config, training, dataset.val_prompts if dataset is not None else []


def _precision_field(train: dict) -> dict:
    """The training's matrix-product dtype where it is not fp32 (an fp32 run's config keeps its old form, so its
    checkpoints still resume)."""
    precision = train.get("precision", torch.float32)
    return {} if precision == torch.float32 else {"precision": str(precision).replace("torch.", "")}


def _width_field(model) -> dict:
    """The head's MLP width where it is not the target's (a default-width run's config keeps its old form)."""
    width = model.eagle_config.intermediate_size
    return {} if width == model.config.intermediate_size else {"head_intermediate_size": width}


def _init_summary(init) -> dict:
    """Where training started, when not from a seeded head (nothing otherwise)."""
    return {} if init is None else {"init_head": str(init.path)}


def _endpoint_summary(served) -> dict:
    """What the training record says of the serving endpoints that wrote the answers (nothing without one)."""
    return {} if served is None else {"regenerate_endpoint": {"model": served.model,
                                                              "urls": [ep.url for ep in served.endpoints]}}


def _train(model, cache, d2t, info, train: dict, work: Path, stages: Stages, world: World):
    """The attached head trained on the cache (on every rank); (model back on the CPU, TrainResult, run config)."""
    if d2t is not None:
        load_d2t(model, d2t)
    _drop_target_layers(model)
    run_on = train["run_on"]
    model.to(run_on)
    run_config = run_config_dict(target=info.path, draft_vocab_size=model.eagle_config.draft_vocab_size,
                                 aux_layer_ids=list(model.eagle_config.eagle_aux_hidden_state_layer_ids),
                                 seq_len=train["seq_len"], lr=train["lr"], warmup_steps=train["warmup_steps"],
                                 **_precision_field(train), **_width_field(model))
    where = f"{world.size} ranks ({run_on.type})" if world.active else str(run_on)
    precision = train.get("precision", torch.float32)
    with stages.stage("train", f"Training draft head on {where}", spinner=False), training_matmul(run_on, precision):
        try:
            result = train_head(model, cache, train["cfg"], work / "checkpoint.safetensors",
                                resume=train["resume"], progress=train["progress"], on_step=train["on_step"],
                                run_config=run_config, world=world)
        finally:
            model.cpu()
    return model, result, run_config


def _prepare_training(model, tokenizer, info, data, work: Path, stages: Stages, progress: bool, *, seq_len,
                      batch_size, regenerate, max_new_tokens, val_prompts, draft_vocab_size, eos, world: World,
                      endpoint=None, precision: torch.dtype = torch.float32, features_from=None):
    """Dataset (cached in the work dir), target feature cache, and d2t (None at full vocab).

    Across ranks: the dataset is made (tokenised, regenerated) by rank 0 alone while the others wait, then read by
    all from the work dir; the feature cache is built by all ranks, each its share (`build_feature_cache`).
    `endpoint` (a `regen_endpoint.Served`): the answers come from those servers, with their progress kept in the
    work dir."""
    answer = None
    if regenerate and endpoint is not None and world.is_main:
        answer = EndpointRegenerator(endpoint, model, tokenizer, eos, work / PROGRESS_NAME,
                                     {"target": _source_stamp(Path(info.path).expanduser().resolve())})
    key = _data_key(info.path, data, seq_len=seq_len, regenerate=regenerate,
                    max_new_tokens=max_new_tokens if regenerate else None, val_prompts=val_prompts,
                    **({"answers_from": "endpoint"} if regenerate and endpoint is not None else {}))
    with stages.stage("data", "Preparing training data", spinner=not regenerate):
        build = lambda: build_dataset(  # noqa: E731
            data, tokenizer, seq_len, model=model, regenerate_answers=regenerate, n_val=val_prompts,
            max_new_tokens=max_new_tokens, gen_batch_size=max(8, batch_size), progress=progress, answer=answer)
        if world.is_main:
            dataset, _ = _load_or_build_dataset(work, key, build)
        world.barrier()
        if not world.is_main:
            dataset, _ = _load_or_build_dataset(work, key, _made_by_rank_0(work))
    if answer is not None and answer.stats:
        dataset.stats["regeneration"] = answer.stats
    aux_ids = default_aux_layer_ids(model.config.num_hidden_layers)
    # The features are stored in bf16 either way; a bf16 forward, or an engine's, computes them differently.
    source = None if features_from is None else EngineSource.open(features_from, model, aux_ids)
    products = [] if precision == torch.float32 or source is not None else [str(precision)]
    products += [] if source is None else [f"engine:{source.digest}"]
    cache_key = hashlib.sha256(json.dumps([key, aux_ids, "bfloat16", *products]).encode()).hexdigest()[:32]
    device = next(model.parameters()).device
    with stages.stage("cache", "Caching target features", spinner=False), training_matmul(device, precision):
        cache = load_feature_cache(work / "cache", cache_key) if world.is_main else None
        if not world.broadcast_object(cache is not None):  # rank 0 decides: the ranks must agree to rebuild
            cache = build_feature_cache(model, dataset.sequences, aux_ids, work / "cache", cache_key,
                                        batch_size=batch_size if source is None else ENGINE_BATCH,
                                        progress=progress, world=world, source=source)
        elif cache is None:
            cache = load_feature_cache(work / "cache", cache_key)
    d2t = None
    vocab = model.config.vocab_size
    if draft_vocab_size is not None and draft_vocab_size < vocab:
        # The head must predict the target's greedy tokens; count those first, the data's own second.
        counts = ranking(cache.predicted_counts, cache.seen_counts)
        d2t = d2t_from_vocab(select_draft_vocab(counts, draft_vocab_size, always=eos))
    return dataset, d2t, cache
