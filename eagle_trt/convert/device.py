"""Where convert's heavy work runs: the target's answers, the feature cache and the head's training.

    from eagle_trt.convert.device import resolve_device, training_matmul
    device = resolve_device("auto")          # cuda when torch sees a GPU, else cpu
    with training_matmul(device):            # TF32 matrix products on CUDA while caching and training
        ...

Only the offline training stages move to the device. The exported checkpoint, its validation and
the KV calibration always run on the CPU copy, so a head trained on a GPU is checked by the same
runtime that serves it. Greedy regeneration keeps full fp32 matrix products on every device: the
answers are the target's own.
"""

from __future__ import annotations

import contextlib

import torch

from eagle_trt.errors import InputError

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def resolve_device(name: str | torch.device | None) -> torch.device:
    """'auto' (or None): the first CUDA GPU if torch sees one, else the CPU; 'cpu', 'cuda', 'cuda:N'."""
    if isinstance(name, torch.device):
        name = str(name)
    text = (name or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        if not torch.cuda.is_available():
            raise InputError(f"--device {text}: this torch ({torch.__version__}) sees no CUDA GPU; "
                             "use --device cpu, or install a CUDA build of torch on a GPU machine")
        index = int(text[5:]) if ":" in text else 0
        if index >= torch.cuda.device_count():
            raise InputError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return torch.device("cuda", index)
    raise InputError(f"--device must be {DEVICE_CHOICES}; got {name!r}")


@contextlib.contextmanager
def training_matmul(device: torch.device):
    """TF32 matrix products on CUDA for the feature cache and training (a no-op on the CPU)."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


__all__ = ["DEVICE_CHOICES", "resolve_device", "training_matmul"]
