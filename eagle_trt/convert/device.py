"""Where convert's heavy work runs: the target's answers, the feature cache and the head's training.

    from eagle_trt.convert.device import resolve_device, resolve_precision, training_matmul
    device = resolve_device("auto")          # cuda when torch sees a GPU, else cpu
    dtype = resolve_precision("auto", device)  # bf16 on a GPU or an AMX CPU, else fp32
    with training_matmul(device, dtype):     # TF32 on CUDA; bf16 autocast where dtype says so
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
from eagle_trt.models import isa

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
PRECISION_CHOICES = ("auto", "float32", "bfloat16")


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


def resolve_precision(name: str | None, device: torch.device) -> torch.dtype:
    """The matrix products' dtype for the feature cache and training: 'float32', 'bfloat16', or 'auto' (bfloat16 on a
    CUDA GPU that has it and on a CPU with AMX-BF16 tiles, where it runs several times faster than fp32; float32
    elsewhere, a CPU without bf16 units above all, where torch emulates it slowly). Weights, gradients and the
    optimizer stay fp32 either way: bfloat16 is autocast, the mixed precision GPU trainings use."""
    text = (name or "auto").strip().lower()
    if text not in PRECISION_CHOICES:
        raise InputError(f"--precision must be one of {', '.join(PRECISION_CHOICES)}; got {name!r}")
    if text == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if device.type == "cpu" and "amx_bf16" in isa.cpu_flags() else torch.float32
    return torch.bfloat16 if text == "bfloat16" else torch.float32


@contextlib.contextmanager
def training_matmul(device: torch.device, dtype: torch.dtype = torch.float32):
    """TF32 matrix products on CUDA, and bf16 autocast where dtype is bfloat16, for the feature cache and training."""
    # No weight-cast cache: autocast keeps the bf16 copy of each trainable weight until its context exits, and this
    # context spans the whole training loop, so every forward would read the weights as they were at the first step.
    cast = (torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False) if dtype == torch.bfloat16
            else contextlib.nullcontext())
    if device.type != "cuda":
        with cast:
            yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with cast:
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


__all__ = ["DEVICE_CHOICES", "PRECISION_CHOICES", "resolve_device", "resolve_precision", "training_matmul"]
