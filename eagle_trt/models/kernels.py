"""Which kernels run a model: chosen once, when its weights are loaded, and named in `run --json` and `bench`.

    kernels = choose_kernels(torch.bfloat16, spec)
    kernels.name            # "amx", "avx512", "avx2" or "torch"
    kernels.row_invariant   # a verify row is bit-identical to decoding that token alone

- amx / avx512 / avx2: the compiled kernels (models/native/), one compiled call per forward. AMX projections where
  the CPU grants the tiles, the engine is bf16 and every projection's input size is a multiple of 32; otherwise
  the vector kernels of this build (AVX-512, or AVX2 + FMA; EAGLE_TRT_ISA forces a lower one).
- torch: the reference (models/reference.py): no compiler, EAGLE_TRT_NATIVE=0, a GPU, float16, or a shape the
  kernels do not take. It stays the oracle the kernels are tested against.
"""

from __future__ import annotations

import torch

from eagle_trt.models import native
from eagle_trt.models.kernel_api import Kernels
from eagle_trt.models.gemm import bf16_hardware
from eagle_trt.models.native import ops as native_ops
from eagle_trt.models.native.kernels import NativeKernels
from eagle_trt.models.reference import TorchKernels


def cpu_has_native_bf16() -> bool:
    """Whether a bf16 engine runs at full speed on this CPU: the compiled kernels (AVX2 and up: bf16 storage, fp32
    or AMX math), or hardware bf16 for torch's. Without either, bf16 matmuls are emulated and run far slower than
    fp32 (docs/bench.md has the figure)."""
    return native.library_or_none() is not None or bf16_hardware()


def projection_inputs(spec) -> list[int]:
    """Input sizes of a target's layer projections (qkv, o, gate_up, down) and LM head."""
    return [spec.hidden_size, spec.num_heads * spec.head_dim, spec.intermediate_size]


def head_inputs(spec, n_aux: int) -> list[int]:
    """Input sizes of an EAGLE-3 head's projections (fc, qkv, o, gate_up, down, LM head)."""
    return [n_aux * spec.hidden_size, 2 * spec.hidden_size, spec.num_heads * spec.head_dim, spec.hidden_size,
            spec.intermediate_size]


def unfit(spec) -> str | None:
    """Why the kernels do not take this layer's shape, or None."""
    if not native_ops.attention_fits(spec.num_heads, spec.num_kv_heads, spec.head_dim):
        return f"attention heads {spec.num_heads}/{spec.num_kv_heads} x {spec.head_dim}"
    if not native_ops.row_ops_fit(spec.num_heads, spec.num_kv_heads, spec.head_dim,
                                  getattr(spec, "attention_bias", False)):
        return f"head_dim {spec.head_dim}"
    return None


def choose_kernels(dtype: torch.dtype, spec, device: torch.device | str = "cpu",
                   block_compute: str = "float") -> Kernels:
    """The kernels for a target of this dtype and layer shape (an EAGLE-3 head takes its target's: see
    `Eagle3DraftHead`); block_compute: how block weights compute (float or int8, the engine's `block_compute`)."""
    device = torch.device(device)
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return TorchKernels(dtype, device, block_compute=block_compute)
    lib = native.library()
    if lib is None:
        return TorchKernels(dtype, device, reason=native.unavailable(), block_compute=block_compute)
    why = unfit(spec)
    if why is not None:
        return TorchKernels(dtype, device, reason=f"the kernels do not take {why}", block_compute=block_compute)
    amx = lib.isa_name == "amx" and dtype == torch.bfloat16
    return NativeKernels(lib, dtype, amx=amx, block_compute=block_compute).fitted(projection_inputs(spec))
