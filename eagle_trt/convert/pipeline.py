"""`eagle-trt convert`: target model -> checkpoint dir with an EAGLE-3 draft head.

    from eagle_trt.convert import convert_model
    result = convert_model("/tmp/tiny-llama", "/tmp/tiny-ckpt", steps=0, overwrite=True)
    print(result.draft_dir, result.summary["aux_layer_ids"])

Stages: load the target, write it to OUT/target, attach a seeded untrained EAGLE-3 head with
modelopt, export the head to OUT/draft, write OUT/convert.json. All of it goes to a temp dir that
is renamed onto OUT only when every stage succeeded.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from eagle_trt.errors import InputError

from .attach import attach_eagle3
from .export import check_output_dir, staged_output, write_draft, write_manifest, write_target
from .load_target import load_target


@dataclass
class ConvertResult:
    """What `convert_model` wrote; `summary` is JSON-ready (the CLI prints it for --json)."""

    output_dir: Path
    target_dir: Path
    draft_dir: Path
    summary: dict = field(default_factory=dict)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import eagle_trt

    found = {"eagle_trt": eagle_trt.__version__}
    for dist in ("torch", "transformers", "nvidia-modelopt"):
        try:
            found[dist.replace("nvidia-", "")] = version(dist)
        except PackageNotFoundError:
            found[dist.replace("nvidia-", "")] = None
    return found


class _Stages:
    """One status line per stage on stderr (stdout stays free for --json), with elapsed time."""

    def __init__(self, enabled: bool):
        self.console = None
        if enabled:
            from rich.console import Console

            self.console = Console(stderr=True)
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str, message: str):
        start = time.perf_counter()
        status = self.console.status(message) if self.console else contextlib.nullcontext()
        with status:
            yield
        self.timings[name] = round(time.perf_counter() - start, 3)
        if self.console:
            self.console.print(f"[green]✓[/] {message} [dim]({self.timings[name]:.1f}s)[/]")


def convert_model(
    model_path: str | Path,
    output_dir: str | Path,
    steps: int = 0,
    draft_vocab_size: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> ConvertResult:
    """Convert MODEL (HF dir or .gguf) into OUT with an EAGLE-3 draft head; see the module doc."""
    if steps < 0:
        raise InputError(f"--steps must be >= 0; got {steps}")
    if steps > 0:
        raise InputError(
            "training (--steps > 0) is not implemented yet; run with --steps 0 for an untrained head"
        )
    if draft_vocab_size is not None and draft_vocab_size < 1:
        raise InputError(f"--draft-vocab-size must be >= 1; got {draft_vocab_size}")
    out = check_output_dir(output_dir, overwrite)  # before the slow load, not after it
    stages = _Stages(progress)

    with stages.stage("load", f"Loading {model_path}"):
        model, tokenizer, info = load_target(model_path)
    with staged_output(out, overwrite) as stage:
        with stages.stage("export_target", "Writing target model"):
            # Before attaching: the target must be saved without eagle_module and under its
            # own class name, and this way needs no second copy of the weights.
            write_target(model, tokenizer, stage / "target")
        with stages.stage("attach", "Attaching EAGLE-3 head (modelopt)"):
            model = attach_eagle3(model, draft_vocab_size)
        with stages.stage("export_draft", "Writing draft head"):
            draft_config = write_draft(model, stage / "draft")
        # Paths stay out of convert.json: the checkpoint dir may be moved after it is written.
        manifest = {
            "source": info.to_dict(),
            "steps": steps,
            "versions": _versions(),
            "aux_layer_ids": draft_config["eagle_aux_hidden_state_layer_ids"],
            "draft_vocab_size": draft_config["draft_vocab_size"],
            "target_vocab_size": draft_config["vocab_size"],
            "rope_theta": draft_config["rope_theta"],
        }
        write_manifest(stage, manifest)
    summary = {
        "output_dir": str(out),
        "target_dir": str(out / "target"),
        "draft_dir": str(out / "draft"),
        **manifest,
        "timings_s": stages.timings,
    }
    return ConvertResult(out, out / "target", out / "draft", summary)
