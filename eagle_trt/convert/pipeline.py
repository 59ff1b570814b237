"""`eagle-trt convert`: target model -> checkpoint dir with an EAGLE-3 draft head.

    from eagle_trt.convert import convert_model
    result = convert_model("/tmp/tiny-llama", "/tmp/tiny-ckpt", steps=0, overwrite=True)
    print(result.draft_dir, result.summary["aux_layer_ids"])

Stages: load the target, write it to OUT/target, attach a seeded untrained EAGLE-3 head with
modelopt, export the head to OUT/draft, write OUT/convert.json. All of it goes to a temp dir that
is renamed onto OUT only when every stage succeeded.

Training (steps > 0 or epochs): after writing OUT/target, the data is tokenized (and optionally
answered by the target itself), the target's features are cached once, the draft vocab is picked
from the target's token frequencies, and the head is trained offline with modelopt's EAGLE-3 loss
(see `train.py`); then OUT/draft holds the trained weights + d2t, and OUT/report.json the
acceptance length tau measured with eagle-trt's runtime on held-out prompts.

    result = convert_model("/tmp/tiny-llama", "/tmp/tiny-ckpt", steps=200, data=["chats.jsonl"],
                           draft_vocab_size=128, overwrite=True)
    result.summary["validation"]["dynamic"]["acceptance_length"]

Resumable state (the dataset, the feature cache and the training checkpoint) lives in a work dir
outside the staged output: `work_dir`, by default `.<OUT name>.train` next to OUT, deleted after a
successful run (an explicit work_dir is kept). Ctrl-C saves a checkpoint there; `resume=True`
continues from it.

Under torchrun (`torchrun --nproc-per-node N -m eagle_trt convert ...`, or `convert --nproc N`, which starts the N
ranks itself, see `launch.py`) every rank runs the training stages together (see `distributed.py`, `train.py`); rank 0 alone
writes OUT and validates the head. docs/training.md has the multi-node command.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Callable

from eagle_trt.eos import eos_token_ids
from eagle_trt.errors import InputError, MissingDependencyError
from eagle_trt.interop.import_head import import_head
from eagle_trt.safetensors_stream import parse_size
from eagle_trt.staging import check_apart

from .attach import default_aux_layer_ids, import_modelopt
from .calibrate import calibrate_kv_scales, fp8_agreement, load_models
from .data import check_specs
from .device import resolve_device, resolve_precision
from .distributed import World
from .draft_model import convert_with_draft_model
from .export import check_output_dir, staged_output, write_manifest, write_target
from .head_training import attach_and_train
from .init_head import open_init_head
from .keep_blocks import keep_blocks
from .load_target import load_target
from .regen_endpoint import EndpointOptions, connect
from .result import ConvertResult
from .stages import Stages, versions
from .train import TrainConfig
from .validate import checkpoint_report, fallback_prompt_ids, write_report


def _eos_ids(model, tokenizer) -> list[int]:
    return eos_token_ids(tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None),
                         getattr(getattr(model, "generation_config", None), "eos_token_id", None))


def _ship_head(stage: Path, tokenizer, info, head: Path, stages, calibrate_kv: bool) -> dict:
    """The checkpoint's draft = an already trained head (copied, then loaded by the runtime with the written target
    to prove it fits; that load also serves the KV calibration). Returns convert.json's content."""
    with stages.stage("head", f"Importing trained head from {head}"):
        # Any supported layout (eagle-trt's own, EAGLE's, SGLang's, speculators', an `eagle-trt export`), checked
        # against the written target and rewritten as eagle-trt's draft dir (`interop/import_head.py`); the
        # prompt-lookup datastore travels with it when there is one.
        target_config = json.loads((stage / "target" / "config.json").read_text())
        head_format = import_head(head, stage / "draft", target_config.get("text_config") or target_config)
        models = load_models(stage)
        draft_config = json.loads((stage / "draft" / "config.json").read_text())
        if (head / "report.json").is_file():
            shutil.copyfile(head / "report.json", stage / "report.json")
    manifest = {
        "source": info.to_dict(), "steps": 0, "head_source": str(head), "head_format": head_format,
        "versions": versions(),
        "aux_layer_ids": draft_config.get("eagle_aux_hidden_state_layer_ids"),
        "draft_vocab_size": draft_config.get("draft_vocab_size"),
        "target_vocab_size": draft_config.get("vocab_size"), "rope_theta": draft_config.get("rope_theta"),
    }
    if calibrate_kv:
        manifest["kv_calibration"] = _calibrate(stage, tokenizer, [], stages, models)
    return manifest


def require_modelopt() -> None:
    """Attaching and training a head needs NVIDIA modelopt, an optional extra since TensorRT-LLM pins its own."""
    if importlib.util.find_spec("modelopt") is None:
        raise MissingDependencyError("convert attaches the EAGLE-3 head with NVIDIA modelopt, which is not installed",
                                     hint="pip install 'eagle-trt[convert]' (or ship a trained head with --head)")


def _check_options(*, steps, epochs, data, head, draft_vocab_size, seq_len, max_shard_size, train_options: dict):
    """Every option checked before anything slow runs: (train?, the TrainConfig or None, the --head dir or None,
    the shard size in bytes)."""
    if steps < 0:
        raise InputError(f"--steps must be >= 0; got {steps}")
    try:
        max_shard_bytes = parse_size(max_shard_size)
    except ValueError as e:
        raise InputError(f"--max-shard-size: {e}") from None
    if draft_vocab_size is not None and draft_vocab_size < 1:
        raise InputError(f"--draft-vocab-size must be >= 1; got {draft_vocab_size}")
    train = steps > 0 or epochs is not None
    cfg = None
    if train:
        if steps > 0 and epochs is not None:
            raise InputError("give either --steps or --epochs, not both")
        if not data:
            raise InputError("training the head needs --data (.jsonl / .txt files or 'humaneval')")
        if seq_len < 8:
            raise InputError(f"--seq-len must be >= 8; got {seq_len}")
        cfg = TrainConfig(steps=steps or None, epochs=epochs, **train_options)
        cfg.validate()
        check_specs(data)
    elif data:
        raise InputError("--data is only used for training: add --steps N or --epochs N")
    if head is not None:
        if train:
            raise InputError("--head ships an already trained head: drop --steps/--epochs/--data")
        head = Path(head).expanduser()
        if not (head / "config.json").is_file() or not (head / "model.safetensors").is_file():
            raise InputError(f"--head '{head}' must be a dir with config.json and model.safetensors")
    return train, cfg, head, max_shard_bytes


def convert_model(
    model_path: str | Path,
    output_dir: str | Path,
    steps: int = 0,
    draft_vocab_size: int | None = None,
    head_intermediate_size: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    *,
    epochs: float | None = None,
    data: list[str | Path] | None = None,
    seq_len: int = 512,
    batch_size: int = 4,
    lr: float = 3e-4,
    warmup_steps: int | None = None,
    ttt_steps: int = 3,
    regenerate: bool = False,
    max_new_tokens: int = 256,
    resume: bool = False,
    work_dir: str | Path | None = None,
    checkpoint_every: int = 50,
    seed: int = 0,
    validate: bool = True,
    val_prompts: int = 4,
    val_max_new_tokens: int = 64,
    on_step: Callable[[dict], None] | None = None,
    head: str | Path | None = None,
    calibrate_kv: bool = True,
    device: str | None = "auto",
    precision: str | None = "auto",
    features_from: str | Path | None = None,
    max_shard_size: str | int = "5GB",
    draft_model: str | Path | None = None,
    regenerate_endpoint: EndpointOptions | None = None,
    init_head: str | Path | None = None,
) -> ConvertResult:
    """Convert MODEL (HF dir or .gguf) into OUT with an EAGLE-3 draft head; see the module doc.

    steps=0 and epochs=None: an untrained (seeded) head, nothing else. Otherwise the head is trained
    on `data` (see `data.py` for the accepted inputs) for `steps` optimizer steps or `epochs` passes.
    `device` ('auto', 'cpu', 'cuda', 'cuda:N') is where regeneration, feature caching and training run;
    everything written is on the CPU (see `device.py`), `precision` ('auto', 'float32', 'bfloat16') the matrix
    products' dtype there. `features_from`: a built engine of this model computes the feature cache
    (`engine_features.py`). `draft_model`: draft with that small LM instead of a head
    (`draft_model.py`). `regenerate_endpoint`: --regenerate asks these OpenAI-compatible servers
    (`regen_endpoint.py`), checked before the target loads. `init_head`: training starts from that head
    (`init_head.py`), whose draft vocabulary and width are kept."""
    init, draft_vocab_size, head_intermediate_size = open_init_head(
        init_head, steps > 0 or epochs is not None, head is not None or draft_model is not None, draft_vocab_size,
        head_intermediate_size)
    _check_flag_combinations(regenerate_endpoint is not None, regenerate, steps > 0 or epochs is not None,
                             head_intermediate_size, head, draft_model, features_from)
    if draft_model is not None:
        _world(False, batch_size)  # nothing to train: one process only
        return convert_with_draft_model(model_path, draft_model, output_dir, overwrite, progress, dict(
            steps=steps, epochs=epochs, data=data, head=head, draft_vocab_size=draft_vocab_size), max_shard_size)
    train, cfg, head, max_shard_bytes = _check_options(
        steps=steps, epochs=epochs, data=data, head=head, draft_vocab_size=draft_vocab_size, seq_len=seq_len,
        max_shard_size=max_shard_size, train_options=dict(batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
                                                           ttt_steps=ttt_steps, checkpoint_every=checkpoint_every,
                                                           seed=seed))
    world = _world(train, batch_size)
    run_on, out, work = _prepare(model_path, output_dir, overwrite, head, train, device, work_dir)
    served = connect(regenerate_endpoint, model_path) if regenerate_endpoint is not None else None
    run_on = world.device(run_on) if train else run_on
    products = resolve_precision(precision, run_on) if train else None  # a bad --precision fails before the load
    progress = progress and world.is_main
    stages = Stages(progress)

    model, tokenizer, info = _load(model_path, stages, draft_vocab_size, init)
    train_options = None if not train else dict(
        cfg=cfg, data=data, run_on=run_on, seq_len=seq_len, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
        ttt_steps=ttt_steps, seed=seed, regenerate=regenerate, max_new_tokens=max_new_tokens, val_prompts=val_prompts,
        resume=resume, progress=progress, on_step=on_step, world=world, endpoint=served,
        precision=products, features_from=features_from, init_head=init)
    if not world.is_main:  # a helper rank trains with the others; rank 0 alone writes OUT
        attach_and_train(model, tokenizer, info, None, stages, work, train_options, draft_vocab_size,
                         _eos_ids(model, tokenizer), head_intermediate_size)
        return ConvertResult(out, out / "target", out / "draft", {"rank": world.rank, "world_size": world.size})
    loaded = [model]
    del model  # _write_checkpoint holds the only reference: it releases the weights before reading the checkpoint
    manifest, report = _write_checkpoint(out, overwrite, stages, loaded, tokenizer, info, dict(
        max_shard_bytes=max_shard_bytes, head=head, calibrate_kv=calibrate_kv, work=work, train_options=train_options,
        draft_vocab_size=draft_vocab_size, head_intermediate_size=head_intermediate_size, steps=steps,
        validate=bool(train and validate),
        val_max_new_tokens=val_max_new_tokens))
    if train and work_dir is None:
        shutil.rmtree(work, ignore_errors=True)  # the default work dir only serves resume after a Ctrl-C
    return _result(out, manifest, report, stages)


def _load(model_path, stages: Stages, draft_vocab_size: int | None, init=None):
    """The target (model, tokenizer, info), and --draft-vocab-size (and an --init-head `init`) checked against it
    before the data, the features or the work dir are touched."""
    with stages.stage("load", f"Loading {model_path}"):
        model, tokenizer, info = load_target(model_path)
    if init is not None:
        init.check(model, default_aux_layer_ids(model.config.num_hidden_layers))
    vocab = model.config.vocab_size
    if draft_vocab_size is not None and draft_vocab_size > vocab:
        raise InputError(f"--draft-vocab-size {draft_vocab_size} exceeds the target's vocabulary ({vocab}); give at "
                         f"most {vocab}, or leave it out for the full vocabulary")
    return model, tokenizer, info


def _result(out: Path, manifest: dict, report: dict | None, stages: Stages) -> ConvertResult:
    summary = {"output_dir": str(out), "target_dir": str(out / "target"), "draft_dir": str(out / "draft"),
               **manifest, "timings_s": stages.timings, "peak_rss_mb": stages.peak_rss_mb}
    if report is not None:
        summary["validation"] = report["validation"]
    return ConvertResult(out, out / "target", out / "draft", summary)


def _check_flag_combinations(endpoint: bool, regenerate: bool, train: bool, head_intermediate_size: int | None,
                             head, draft_model, features_from) -> None:
    """Options that only mean something beside others: each mismatch is one InputError naming the flags."""
    if endpoint and (draft_model is not None or not regenerate or not train):
        raise InputError("--regenerate-endpoint is where --regenerate gets the answers for training a head: add "
                         "--regenerate and --steps N or --epochs N (and no --draft-model)")
    if head_intermediate_size is not None and (head_intermediate_size < 1 or head is not None
                                               or draft_model is not None):
        raise InputError(f"--head-intermediate-size {head_intermediate_size}: the width of a head made here, at "
                         "least 1 (not with --head or --draft-model, which bring their own)")
    if features_from is not None and (not (Path(features_from).expanduser() / "manifest.json").is_file()
                                      or not train):
        raise InputError(f"--features-from {features_from}: an engine dir (`eagle-trt build` of MODEL) that computes "
                         "the features for training a head: add --steps N or --epochs N with --data")


def _write_checkpoint(out: Path, overwrite: bool, stages: Stages, loaded: list, tokenizer, info, o: dict):
    """OUT written atomically: the target (and a GGUF's own blocks), then the head shipped from o["head"] or attached,
    trained and checked; (manifest, validation report or None). `loaded` holds the loaded model, the only reference
    to it: taken out here, its weights are released before the head's checks read the written checkpoint."""
    model = loaded.pop()
    report = None
    with staged_output(out, overwrite) as stage:
        with stages.stage("export_target", "Writing target model"):
            # Before attaching: the target must be saved without eagle_module and under its
            # own class name, and this way needs no second copy of the weights.
            write_target(model, tokenizer, stage / "target", o["max_shard_bytes"])
            if info.format == "gguf":  # the file's own blocks too, for `build` with weights: auto
                keep_blocks(Path(info.path), stage / "target")
        if o["head"] is not None:
            del model  # what follows reads the written checkpoint: never two copies of the weights at once
            gc.collect()
            manifest = _ship_head(stage, tokenizer, info, Path(o["head"]), stages, o["calibrate_kv"])
        else:
            eos = _eos_ids(model, tokenizer)
            trained = attach_and_train(model, tokenizer, info, stage, stages, o["work"], o["train_options"],
                                       o["draft_vocab_size"], eos, o["head_intermediate_size"])
            del model
            gc.collect()
            manifest, report = _check_head(stage, tokenizer, stages, _draft_manifest(info, o["steps"], *trained),
                                           validate=o["validate"], calibrate_kv=o["calibrate_kv"],
                                           val_max_new_tokens=o["val_max_new_tokens"])
        write_manifest(stage, manifest)
    return manifest, report


def _world(train: bool, batch_size: int) -> World:
    """This process's place under torchrun (a world of one without it), checked against the options."""
    world = World.from_env()
    if world.active and not train:
        raise InputError(f"convert runs on {world.size} processes (torchrun / --nproc) only to train a head: add "
                         "--steps N or --epochs N with --data, or run it as one process")
    if world.size > batch_size:
        raise InputError(f"--batch-size {batch_size} is the global batch and is smaller than the {world.size} ranks; "
                         f"give at least --batch-size {world.size}")
    return world


def _prepare(model_path, output_dir, overwrite: bool, head: Path | None, train: bool, device: str | None,
             work_dir) -> tuple[object, Path, Path]:
    """Everything checked before the slow load: modelopt (for a head made here), the device, the output dir (not
    the model's or the shipped head's). Returns (the training device or None, the output dir, the work dir)."""
    if head is None:
        require_modelopt()
        import_modelopt()  # before the model loads: see attach.import_modelopt
    run_on = resolve_device(device) if train else None
    out = check_output_dir(output_dir, overwrite)
    check_apart(model_path, out, "the model being converted")
    if head is not None:
        check_apart(head, out, "the --head being shipped")
    work = Path(work_dir).expanduser().absolute() if work_dir else out.parent / f".{out.name}.train"
    return run_on, out, work


def _check_head(stage: Path, tokenizer, stages, made: tuple[dict, list], validate: bool, calibrate_kv: bool,
                val_max_new_tokens: int) -> tuple[dict, dict | None]:
    """After a head was made here: its manifest written, then (as asked) the held-out validation report and the
    FP8 KV-cache calibration, which lands in the manifest. Returns (manifest, report or None)."""
    manifest, val_prompts_ids = made
    write_manifest(stage, manifest)
    report = None
    if validate:
        report = _validate(stage, tokenizer, val_prompts_ids, manifest["training"], val_max_new_tokens, stages)
    if calibrate_kv:
        manifest["kv_calibration"] = _calibrate(stage, tokenizer, val_prompts_ids, stages)
    return manifest, report


def _draft_manifest(info, steps: int, draft_config: dict, training: dict, val_prompts: list) -> tuple[dict, list]:
    """convert.json for a head made here (paths stay out of it: the checkpoint dir may be moved), and the held-out
    prompts that validation and calibration use."""
    manifest = {
        "source": info.to_dict(),
        "steps": training.get("steps", steps),
        "versions": versions(),
        "aux_layer_ids": draft_config["eagle_aux_hidden_state_layer_ids"],
        "draft_vocab_size": draft_config["draft_vocab_size"],
        "target_vocab_size": draft_config["vocab_size"],
        "rope_theta": draft_config["rope_theta"],
    }
    if training:
        manifest["training"] = training
    return manifest, val_prompts


def _calibrate(stage: Path, tokenizer, prompts, stages: Stages, models=None) -> dict:
    """FP8 KV scales for target and head (CKPT/kv_scales.safetensors) + what FP8 KV keeps of greedy output."""
    prompts = list(prompts) or fallback_prompt_ids(tokenizer)
    with stages.stage("calibrate", f"Calibrating FP8 KV scales on {len(prompts)} prompts"):
        models = models or load_models(stage)
        result = calibrate_kv_scales(stage, prompts, new_tokens=16, models=models)
        result["fp8_vs_fp32"] = fp8_agreement(stage, prompts, new_tokens=32, models=models)
    return result


def _validate(stage: Path, tokenizer, prompts, training: dict, max_new_tokens: int, stages: Stages) -> dict:
    """tau of the exported head on the held-out prompts; writes OUT/report.json and prints it."""
    which = f"{len(prompts)} held-out" if prompts else "the built-in"
    with stages.stage("validate", f"Measuring acceptance length on {which} prompts"):
        report = checkpoint_report(stage, tokenizer, prompts, training, max_new_tokens)
    write_report(stage, report)
    if stages.console is not None:
        stages.console.print_json(json.dumps(report))
    return report
