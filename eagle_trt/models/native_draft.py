"""The bf16 draft head's forward in one compiled call (`csrc/draft_layer.cpp`, built by `native.py`).

`Eagle3DraftHead._forward_fused` makes about twenty operator and kernel calls; drafting runs it two to four times a
speculative step. This runs the layer, its norms and the draft LM head from C++ with the target's kernels (the
compiled attention in place of torch's: the head only proposes, so its numerics need no invariance). It serves a
head whose projections all run on the AMX kernel and whose KV cache is bf16; elsewhere, or with EAGLE_TRT_STACK=0,
`load()` returns None and the Python path runs.
"""

from __future__ import annotations

import ctypes

import torch

from eagle_trt.models import native, native_stack

BF16 = torch.bfloat16


class DraftWeights:
    """The head's pointer table (csrc/draft_layer.cpp's slot order), built once; it keeps its tensors alive."""

    def __init__(self, head):
        row = [head.input_norm, head.hidden_norm, head.qkv.amx, head.o.amx, head.post_norm, head.gate_up.amx,
               head.down.amx, head.norm, head.lm_head.amx]
        for t in row:
            if t.dtype is not BF16 or not t.is_cpu or not t.is_contiguous():
                raise TypeError(f"the draft layer takes contiguous bf16 CPU weights, got {t.dtype}")
        self.keep = row
        self.table = (ctypes.c_void_p * len(row))(*[t.data_ptr() for t in row])
        self.vocab = head.lm_head.w.shape[1]


class DraftLayer:
    def __init__(self, lib: ctypes.CDLL):
        i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        self._run = lib.eagle_trt_draft_layer
        self._run.argtypes = [ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, i64, i64, i64, i64, i64,
                              i64, i64, f32, i32, ptr, ptr, ptr, i32]
        self._run.restype = i32
        self._top = lib.eagle_trt_top_logp
        self._top.argtypes, self._top.restype = [ptr, i64, i64, i32, ptr, ptr], i32
        self._scratch = lib.eagle_trt_draft_scratch
        self._scratch.argtypes = [i64] * 6
        self._scratch.restype = i64

    @staticmethod
    def supports(head) -> bool:
        """Every projection of the layer and the LM head on the AMX kernel."""
        return all(p.amx is not None for p in (head.qkv, head.o, head.gate_up, head.down, head.lm_head))

    def __call__(self, weights: DraftWeights, spec, hidden: torch.Tensor, e: torch.Tensor, prenorm: bool,
                 cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
                 mask: torch.Tensor | None, last_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden, e [T, H] bf16; cos/sin [T, D]; caches [Hkv, capacity, D] bf16 views; mask [T, start + T] bool or
        None -> (draft logits [T or 1, vocab], the layer's pre-norm output [T, H])."""
        t, n = hidden.shape
        hidden, e, cos, sin = hidden.contiguous(), e.contiguous(), cos.contiguous(), sin.contiguous()
        for name, x in (("hidden", hidden), ("embeddings", e), ("cos", cos), ("sin", sin)):
            if x.dtype is not BF16:
                raise TypeError(f"the draft layer takes bf16 {name}, got {x.dtype}")
        if k_cache.dtype is not BF16 or v_cache.stride() != k_cache.stride() or k_cache.stride(-1) != 1:
            raise TypeError("the draft layer takes bf16 K and V caches of one layout")
        if start + t > k_cache.shape[1]:
            raise RuntimeError(f"KV cache full: need {start + t} slots, capacity {k_cache.shape[1]}")
        m = native.byte_mask(mask, t, start + t)
        out = torch.empty(t, n, dtype=BF16)
        logits = torch.empty(1 if last_only else t, weights.vocab, dtype=BF16)
        dims = (t, n, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size)
        scratch = native.scratch(self._scratch(*dims))
        rc = self._run(weights.table, hidden.data_ptr(), e.data_ptr(), int(prenorm), cos.data_ptr(), sin.data_ptr(),
                       k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), start,
                       m.data_ptr() if m is not None else None, *dims, weights.vocab, spec.rms_norm_eps,
                       int(last_only), out.data_ptr(), logits.data_ptr(), scratch.data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"native draft layer failed (code {rc}) for {t} rows after {start} cached")
        return logits, out

    def top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [R, V] bf16 -> (log-probs [R, k] fp32, largest first; their indices [R, k]): what
        `torch.log_softmax(logits.float(), -1).topk(k)` gives up to the last bits of the log-probs (the earlier
        index first on ties), in one pass over each row."""
        if logits.dtype is not BF16 or logits.dim() != 2:
            raise TypeError(f"top_logp takes 2-D bf16 logits, got {logits.dtype} {list(logits.shape)}")
        logits = logits.contiguous()
        rows, v = logits.shape
        k = min(k, v)
        vals, idx = torch.empty(rows, k), torch.empty(rows, k, dtype=torch.int64)
        if rows and self._top(logits.data_ptr(), rows, v, k, vals.data_ptr(), idx.data_ptr()) != 0:
            raise RuntimeError(f"native top_logp failed for k={k}")
        return vals, idx


def load() -> DraftLayer | None:
    """The compiled draft layer (one per process), or None: EAGLE_TRT_STACK=0, or no compiled kernels."""
    if not native_stack.enabled():
        return None
    return native.shared(DraftLayer)
