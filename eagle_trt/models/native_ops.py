"""The bf16 decoder layer's per-row operations in C++ (`csrc/row_ops.cpp`, built by `native.py`).

Residual add + RMSNorm, RoPE + the KV-cache write, and SiLU(gate) * up, each one call instead of five to fifteen
torch operators. Rows are computed independently, in an order fixed by the row length, so a tree-verify row
gives the same bits as decoding that token alone. The bf16 target uses them where its KV cache is bf16
(`LlamaTarget`); without a compiler, or with EAGLE_TRT_NATIVE=0, `load()` returns None and the layer runs on
torch operators.
"""

from __future__ import annotations

import ctypes

import torch

from eagle_trt.models import native

BF16 = torch.bfloat16
# The RoPE kernel stages a biased qkv row on its stack: (heads + 2 kv heads) * head_dim up to this many elements.
MAX_BIASED_ROW = 8192 + 3 * 1024


class RowOps:
    def __init__(self, lib: ctypes.CDLL):
        i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        self._norm = lib.eagle_trt_add_rms_norm
        self._norm.argtypes = [ptr, ptr, ptr, ptr, i64, i64, f32, i32]
        self._rope = lib.eagle_trt_rope_qkv
        self._rope.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, i64, i64, i64, i64, i64, i64, i32]
        self._silu = lib.eagle_trt_silu_mul
        self._silu.argtypes = [ptr, ptr, i64, i64, i32]
        self._argmax = lib.eagle_trt_argmax
        self._argmax.argtypes = [ptr, i64, i64, ptr]
        for fn in (self._norm, self._rope, self._silu, self._argmax):
            fn.restype = i32

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int, has_bias: bool) -> bool:
        """Shapes the kernels take: an even head_dim up to 1024, and a biased qkv row that fits the stage."""
        return head_dim % 2 == 0 and 0 < head_dim <= 1024 and (
            not has_bias or (heads + 2 * kv_heads) * head_dim <= MAX_BIASED_ROW)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                     out: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, n] bf16 contiguous becomes x + delta in place (delta None: unchanged); returns RMSNorm(x) * weight
        (in `out` if given: [T, n] bf16 contiguous, not x or delta)."""
        t, n = _rows(x, "x")
        if delta is not None:
            delta = delta.contiguous()
            _same(delta, (t, n), "delta")
        _same(weight, (n,), "weight")
        h = native.out_buffer(out, (t, n), BF16)
        rc = self._norm(x.data_ptr(), delta.data_ptr() if delta is not None else None, weight.data_ptr(),
                        h.data_ptr(), t, n, eps, torch.get_num_threads())
        _ok(rc, "add_rms_norm")
        return h

    def rope_qkv(self, qkv: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, heads: int, kv_heads: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """qkv [T, (H + 2 Hkv) D] (+ bias) -> q [H, T, D] rotated (in `out` if given); k rotated and v written to
        rows start.. of k_cache / v_cache ([Hkv, capacity, D] views, last dim contiguous)."""
        qkv = qkv.contiguous()
        t, width = _rows(qkv, "qkv")
        d = width // (heads + 2 * kv_heads)
        cos, sin = cos.contiguous(), sin.contiguous()
        _same(cos, (t, d), "cos")
        _same(sin, (t, d), "sin")
        if bias is not None:
            _same(bias, (width,), "bias")
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if c.dtype is not BF16 or not c.is_cpu or c.stride(-1) != 1 or c.shape[0] != kv_heads or c.shape[-1] != d:
                raise ValueError(f"{name} must be a bf16 [{kv_heads}, capacity, {d}] view, got {c.dtype} "
                                 f"{tuple(c.shape)}")
            if start + t > c.shape[1]:
                raise RuntimeError(f"KV cache full: need {start + t} slots, capacity {c.shape[1]}")
        q = native.out_buffer(out, (heads, t, d), BF16)
        rc = self._rope(qkv.data_ptr(), bias.data_ptr() if bias is not None else None, cos.data_ptr(), sin.data_ptr(),
                        q.data_ptr(), k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), v_cache.data_ptr(),
                        v_cache.stride(0), v_cache.stride(1), start, t, heads, kv_heads, d, torch.get_num_threads())
        _ok(rc, "rope_qkv")
        return q

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """gate_up [T, 2I] bf16 (gate columns, then up) -> silu(gate) * up [T, I] (in `out` if given)."""
        gate_up = gate_up.contiguous()
        t, two_i = _rows(gate_up, "gate_up")
        out = native.out_buffer(out, (t, two_i // 2), BF16)
        _ok(self._silu(gate_up.data_ptr(), out.data_ptr(), t, two_i // 2, torch.get_num_threads()), "silu_mul")
        return out

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [T, V] bf16 -> [T] int64, torch.argmax's answer (first maximum; NaN counts as the largest),
        without converting the rows."""
        logits = logits.contiguous()
        t, v = _rows(logits, "logits")
        out = torch.empty(t, dtype=torch.long)
        _ok(self._argmax(logits.data_ptr(), t, v, out.data_ptr()), "argmax")
        return out


# Checks on every call, kept to attribute reads: these run 120 times a forward.
def _bad(x: torch.Tensor, name: str) -> TypeError:
    return TypeError(f"native row ops take contiguous bf16 CPU tensors; {name} is {x.dtype} on {x.device}"
                     + ("" if x.is_contiguous() else ", not contiguous"))


def _rows(x: torch.Tensor, name: str) -> tuple[int, int]:
    if x.dtype is not BF16 or not x.is_cpu or not x.is_contiguous():
        raise _bad(x, name)
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, width], got {list(x.shape)}")
    return x.shape


def _same(x: torch.Tensor, shape: tuple, name: str) -> None:
    if x.dtype is not BF16 or not x.is_cpu or not x.is_contiguous():
        raise _bad(x, name)
    if x.shape != shape:
        raise ValueError(f"{name} must be {list(shape)}, got {list(x.shape)}")


def _ok(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"native {what} failed: unsupported shape (code {rc})")


def load() -> RowOps | None:
    """The compiled row ops (one per process), or None (disabled, no compiler, or the build failed: see
    `native.library`)."""
    return native.shared(RowOps)
