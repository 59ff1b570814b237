"""What a `convert` wrote, whichever drafter it made (pipeline.py: an EAGLE-3 head; draft_model.py: a small LM)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ConvertResult:
    """What `convert_model` wrote; `summary` is JSON-ready (the CLI prints it for --json)."""

    output_dir: Path
    target_dir: Path
    draft_dir: Path
    summary: dict = field(default_factory=dict)
