"""The per-row kernels' Python faces: residual add + RMSNorm, RoPE + KV write, SiLU * up, argmax, top-k log-probs
(`csrc/row_ops.cpp`, `csrc/draft_layer.cpp`) and the row-invariant attention (`csrc/tree_attention.cpp`).

Every one keeps each output row a function of that row's inputs alone, for fp32 and bf16 tensors alike (bf16 rounds
where torch's bf16 operators round). The one-call forwards (`stack.py`) run them from C++; these are for tests,
timing scripts and the draft head's top-k.

    h = add_rms_norm(lib, x, delta, weight, eps)     # x += delta in place; returns the norm of x times weight
"""

from __future__ import annotations

import math

import torch

BF16 = torch.bfloat16
_FLOATS = (torch.float32, BF16)
MAX_BIASED_ROW = 8192 + 3 * 1024  # kMaxBiasedRow in csrc/row_ops.cpp


def row_ops_fit(heads: int, kv_heads: int, head_dim: int, has_bias: bool) -> bool:
    """Shapes the row ops take: an even head_dim up to 1024, and a biased qkv row that fits the kernel's stage."""
    return head_dim % 2 == 0 and 0 < head_dim <= 1024 and (
        not has_bias or (heads + 2 * kv_heads) * head_dim <= MAX_BIASED_ROW)


def attention_fits(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Shapes the attention kernel takes (its fixed scratch): up to 64 query heads per KV head, head_dim <= 1024."""
    return kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= 64 and head_dim <= 1024


def is_bf16(x: torch.Tensor) -> int:
    return int(x.dtype is BF16)


def out_buffer(out, shape: tuple, dtype):
    """Where a kernel writes its result: `out` (a caller's buffer), which must be a contiguous CPU tensor of this
    shape and dtype, else a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype)
    if out.dtype is not dtype or not out.is_cpu or not out.is_contiguous() or out.shape != shape:
        raise ValueError(f"out must be a contiguous {dtype} CPU tensor of shape {list(shape)}, got {out.dtype} "
                         f"{list(out.shape)}")
    return out


def byte_mask(mask: torch.Tensor | None, rows: int, keys: int) -> torch.Tensor | None:
    """A bool [rows, keys] visibility mask as the bytes the kernels read, or None for none."""
    if mask is None:
        return None
    if mask.shape != (rows, keys) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool [{rows}, {keys}], got {mask.dtype} {tuple(mask.shape)}")
    return mask.contiguous().view(torch.uint8)


def _rows(x: torch.Tensor, name: str, dtype=None) -> tuple[int, int]:
    if x.dtype not in _FLOATS or (dtype is not None and x.dtype is not dtype) or not x.is_cpu \
            or not x.is_contiguous():
        raise TypeError(f"native row ops take contiguous fp32 or bf16 CPU tensors of one dtype; {name} is {x.dtype} "
                        f"on {x.device}" + ("" if x.is_contiguous() else ", not contiguous"))
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, width], got {list(x.shape)}")
    return x.shape


def _same(x: torch.Tensor, shape: tuple, name: str, dtype) -> None:
    if x.dtype is not dtype or not x.is_cpu or not x.is_contiguous():
        raise TypeError(f"native row ops take contiguous {dtype} CPU tensors here; {name} is {x.dtype}")
    if x.shape != shape:
        raise ValueError(f"{name} must be {list(shape)}, got {list(x.shape)}")


def _ok(rc: int, what: str) -> None:
    if rc != 0:
        why = "out of memory" if rc == -1 else "unsupported shape"
        raise RuntimeError(f"native {what} failed: {why} (code {rc})")


def add_rms_norm(lib, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, n] contiguous becomes x + delta in place (delta None: unchanged); returns RMSNorm(x) * weight."""
    t, n = _rows(x, "x")
    if delta is not None:
        delta = delta.contiguous()
        _same(delta, (t, n), "delta", x.dtype)
    _same(weight, (n,), "weight", x.dtype)
    h = out_buffer(out, (t, n), x.dtype)
    _ok(lib.add_rms_norm(x.data_ptr(), delta.data_ptr() if delta is not None else None, weight.data_ptr(),
                         h.data_ptr(), t, n, eps, is_bf16(x), torch.get_num_threads()), "add_rms_norm")
    return h


def rope_qkv(lib, qkv: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
             k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, heads: int, kv_heads: int) -> torch.Tensor:
    """qkv [T, (H + 2 Hkv) D] (+ bias) -> q [H, T, D] rotated; k rotated and v written to rows start.. of k_cache /
    v_cache ([Hkv, capacity, D] views, last dim contiguous)."""
    qkv = qkv.contiguous()
    t, width = _rows(qkv, "qkv")
    d = width // (heads + 2 * kv_heads)
    cos, sin = cos.contiguous(), sin.contiguous()
    _same(cos, (t, d), "cos", qkv.dtype)
    _same(sin, (t, d), "sin", qkv.dtype)
    if bias is not None:
        _same(bias, (width,), "bias", qkv.dtype)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dtype is not qkv.dtype or not c.is_cpu or c.stride(-1) != 1 or c.shape[0] != kv_heads or c.shape[-1] != d:
            raise ValueError(f"{name} must be a {qkv.dtype} [{kv_heads}, capacity, {d}] view, got {c.dtype} "
                             f"{tuple(c.shape)}")
        if start + t > c.shape[1]:
            raise RuntimeError(f"KV cache full: need {start + t} slots, capacity {c.shape[1]}")
    q = torch.empty(heads, t, d, dtype=qkv.dtype)
    _ok(lib.rope_qkv(qkv.data_ptr(), bias.data_ptr() if bias is not None else None, cos.data_ptr(), sin.data_ptr(),
                     q.data_ptr(), k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), v_cache.data_ptr(),
                     v_cache.stride(0), v_cache.stride(1), start, t, heads, kv_heads, d, is_bf16(qkv),
                     torch.get_num_threads()), "rope_qkv")
    return q


def silu_mul(lib, gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate columns, then up) -> silu(gate) * up [T, I]."""
    gate_up = gate_up.contiguous()
    t, two_i = _rows(gate_up, "gate_up")
    out = torch.empty(t, two_i // 2, dtype=gate_up.dtype)
    _ok(lib.silu_mul(gate_up.data_ptr(), out.data_ptr(), t, two_i // 2, is_bf16(gate_up), torch.get_num_threads()),
        "silu_mul")
    return out


def argmax(lib, logits: torch.Tensor) -> torch.Tensor:
    """logits [T, V] -> [T] int64, torch.argmax's answer (first maximum; NaN counts as the largest)."""
    logits = logits.contiguous()
    t, v = _rows(logits, "logits")
    out = torch.empty(t, dtype=torch.long)
    _ok(lib.argmax(logits.data_ptr(), t, v, is_bf16(logits), out.data_ptr()), "argmax")
    return out


def top_logp(lib, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] -> (log-probs [R, k] fp32, largest first; their indices [R, k]): what
    `torch.log_softmax(logits.float(), -1).topk(k)` gives up to the last bits of the log-probs (the earlier index
    first on ties), in one pass over each row."""
    logits = logits.contiguous()
    rows, v = _rows(logits, "logits")
    k = min(k, v)
    vals, idx = torch.empty(rows, k), torch.empty(rows, k, dtype=torch.int64)
    if rows:
        _ok(lib.top_logp(logits.data_ptr(), rows, v, k, vals.data_ptr(), idx.data_ptr(), is_bf16(logits)), "top_logp")
    return vals, idx


class Attention:
    """`attention(q, k, v, mask)` with the contract of `layers.attention`, from the compiled row-invariant kernel:
    each output row depends only on its query and its visible keys in slot order."""

    def __init__(self, lib):
        self.lib = lib

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                 scale: float | None = None) -> torch.Tensor:
        """q: [H, T, D], k/v: [Hkv, S, D] (any head/row strides, last dim contiguous), mask: [T, S] bool or None;
        scale: the scores' factor (None: D^-0.5).

        Returns [T, H*D] in q's dtype."""
        h, t, d = q.shape
        hkv, s, _ = k.shape
        if q.dtype not in _FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
            raise TypeError(f"native attention takes float32 or bfloat16, got {q.dtype}/{k.dtype}/{v.dtype}")
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        m = byte_mask(mask, t, s)
        out = torch.empty(t, h * d, dtype=q.dtype)
        rc = self.lib.tree_attention(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
                                     v.data_ptr(), v.stride(0), v.stride(1), m.data_ptr() if m is not None else None,
                                     out.data_ptr(), h, hkv, t, s, d, 1.0 / math.sqrt(d) if scale is None else scale,
                                     is_bf16(q),
                                     torch.get_num_threads())
        _ok(rc, f"attention (heads {h}/{hkv}, head_dim {d})")
        return out
