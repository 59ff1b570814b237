"""The bf16 target's decoder stack in one compiled call (`csrc/decoder_stack.cpp`, built by `native.py`).

The layer loop of `LlamaTarget._hidden_states_fused` makes about 270 kernel calls a forward, each through ctypes
with its checks; this runs the same kernels in the same order from C++, so it gives the same bits in one call.
It serves a target whose projections all run on the AMX kernel (models/native_gemm.py) and whose KV cache is bf16;
elsewhere, or with EAGLE_TRT_STACK=0, `load()` returns None and the Python loop runs.
"""

from __future__ import annotations

import ctypes
import os

import torch

from eagle_trt.models import native

BF16 = torch.bfloat16


class StackWeights:
    """The per-layer pointer table of one target (csrc/decoder_stack.cpp's slot order: input norm, qkv, qkv bias, o,
    post norm, gate_up, down), built once; it keeps the tensors it points at alive."""

    def __init__(self, layers, final_norm: torch.Tensor):
        keep, ptrs = [final_norm], []
        for lw in layers:
            row = [lw.input_norm, lw.qkv.amx, lw.qkv_bias, lw.o.amx, lw.post_norm, lw.gate_up.amx, lw.down.amx]
            for t in row:
                if t is not None and (t.dtype is not BF16 or not t.is_cpu or not t.is_contiguous()):
                    raise TypeError(f"the decoder stack takes contiguous bf16 CPU weights, got {t.dtype}")
            keep += [t for t in row if t is not None]
            ptrs += [t.data_ptr() if t is not None else None for t in row]
        self.keep = keep
        self.table = (ctypes.c_void_p * len(ptrs))(*ptrs)
        self.final_norm = final_norm
        self.num_layers = len(layers)


class DecoderStack:
    def __init__(self, lib: ctypes.CDLL):
        i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        self._run = lib.eagle_trt_decoder_stack
        self._run.argtypes = [ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, ptr, i64, i64, i64,
                              i64, i64, i64, f32, ptr, i64, ptr, ptr, i32]
        self._run.restype = i32
        self._scratch = lib.eagle_trt_stack_scratch
        self._scratch.argtypes = [i64] * 6
        self._scratch.restype = i64
        self._ids: dict[tuple, torch.Tensor] = {}

    def _aux_ids(self, layers: list[int]) -> torch.Tensor:
        """The feature layers as the kernel reads them (ascending, once each), made once per list."""
        key = tuple(layers)
        if key not in self._ids:
            self._ids[key] = torch.tensor(sorted(set(layers)), dtype=torch.int64)
        return self._ids[key]

    @staticmethod
    def supports(layers) -> bool:
        """Every projection on the AMX kernel (bf16 weights, packed)."""
        return all(p.amx is not None for lw in layers for p in (lw.qkv, lw.o, lw.gate_up, lw.down))

    def __call__(self, weights: StackWeights, spec, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, mask: torch.Tensor | None,
                 aux_layers: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [T, hidden] bf16 (updated in place to the last layer's output), cos/sin [T, D], caches [L, Hkv,
        capacity, D] bf16, mask [T, start + T] bool or None -> (final-normed hidden [T, hidden], the aux layers'
        outputs [T, len(aux_layers) * hidden] or None)."""
        s = spec
        t, hidden = x.shape
        if x.dtype is not BF16 or not x.is_contiguous():
            raise TypeError(f"the decoder stack takes a contiguous bf16 input, got {x.dtype}")
        if k_cache.dtype is not BF16 or v_cache.stride() != k_cache.stride() or k_cache.stride(-1) != 1:
            raise TypeError("the decoder stack takes bf16 K and V caches of one layout")
        if start + t > k_cache.shape[2]:
            raise RuntimeError(f"KV cache full: need {start + t} slots, capacity {k_cache.shape[2]}")
        cos, sin = cos.contiguous(), sin.contiguous()
        m = native.byte_mask(mask, t, start + t)
        ids = self._aux_ids(aux_layers)
        aux = torch.empty(t, ids.numel() * hidden, dtype=BF16) if ids.numel() else None
        h = torch.empty(t, hidden, dtype=BF16)
        dims = (t, hidden, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size)
        scratch = native.scratch(self._scratch(*dims))
        rc = self._run(x.data_ptr(), weights.table, weights.num_layers, weights.final_norm.data_ptr(), h.data_ptr(),
                       cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0),
                       k_cache.stride(1), k_cache.stride(2), start, m.data_ptr() if m is not None else None, *dims,
                       s.rms_norm_eps, ids.data_ptr(), ids.numel(), aux.data_ptr() if aux is not None else None,
                       scratch.data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"native decoder stack failed (code {rc}) for {t} rows after {start} cached")
        return h, aux


def enabled() -> bool:
    return os.environ.get("EAGLE_TRT_STACK", "1") != "0"


def load() -> DecoderStack | None:
    """The compiled stack (one per process), or None: EAGLE_TRT_STACK=0, or no compiled kernels (see
    `native.library`)."""
    if not enabled():
        return None
    return native.shared(DecoderStack)
