"""Row-invariant attention from a small C++ kernel (`csrc/tree_attention.cpp`, built by `native.py`).

Each output row depends only on its query and its visible keys in slot order, so a tree-verify row gives the
same bits as decoding that token alone (the property greedy losslessness rests on) at fp32 speed. The bf16
target uses it (`llama.pick_attention`); the float64 fallback (`layers.attention_fp64`) has the same property
at about twice the cost (`scripts/kernel_timings.py`). Without a compiler, or with EAGLE_TRT_NATIVE=0, `load()`
returns None and the engine uses the fallback.
"""

from __future__ import annotations

import ctypes
import math

import torch

from eagle_trt.models import native

_TYPES = {torch.float32: 0, torch.bfloat16: 1}


class NativeAttention:
    """`attention(q, k, v, mask)` with the contract of `layers.attention`, computed by the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL):
        fn = lib.eagle_trt_tree_attention
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        fn.argtypes = [ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, ptr,
                       i32, i32, i32, i32, i32, ctypes.c_float, i32, i32]
        fn.restype = i32
        self._fn = fn

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
        """Shapes the kernel takes (its fixed scratch): up to 64 query heads per KV head, head_dim up to 1024."""
        return kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= 64 and head_dim <= 1024

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q: [H, T, D], k/v: [Hkv, S, D] (any head/row strides, last dim contiguous), mask: [T, S] bool or None.

        Returns [T, H*D] in q's dtype."""
        h, t, d = q.shape
        hkv, s, _ = k.shape
        kind = _TYPES.get(q.dtype)
        if kind is None or k.dtype != q.dtype or v.dtype != q.dtype:
            raise TypeError(f"native attention takes float32 or bfloat16, got {q.dtype}/{k.dtype}/{v.dtype}")
        if q.stride(-1) != 1:
            q = q.contiguous()
        if k.stride(-1) != 1:
            k = k.contiguous()
        if v.stride(-1) != 1:
            v = v.contiguous()
        m = native.byte_mask(mask, t, s)
        out = torch.empty(t, h * d, dtype=q.dtype)
        rc = self._fn(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
                      v.data_ptr(), v.stride(0), v.stride(1), m.data_ptr() if m is not None else None,
                      out.data_ptr(), h, hkv, t, s, d, 1.0 / math.sqrt(d), kind, torch.get_num_threads())
        if rc != 0:
            why = "out of memory" if rc == -1 else f"unsupported shape (heads {h}/{hkv}, head_dim {d})"
            raise RuntimeError(f"native attention kernel failed: {why}")
        return out


def load() -> NativeAttention | None:
    """The compiled kernel (one per process), or None (disabled, no compiler, or the build failed: see
    `native.library`)."""
    return native.shared(NativeAttention)
