"""The one-call forwards: the target's decoder stack (`csrc/decoder_stack.cpp`) and the draft head's layer
(`csrc/draft_layer.cpp`), each all its kernels in one compiled call.

The layer loop of a 30-layer target is about 270 kernel calls a forward; through ctypes each would cost a transition
and its checks. These run the same kernels in C++, for fp32 or bf16 activations and either projection kernel (the
packed weights say which), and every kernel keeps each row a function of that row alone.

    table = StackWeights(layers, final_norm)
    h, aux = decoder_stack(lib, table, spec=spec, x=x, cos=cos, sin=sin, parts=[Part(cache, start, rows, mask)],
                           aux_layers=aux_layers)
"""

from __future__ import annotations

import ctypes
import math

import torch

from eagle_trt.models.native import ops

_scratch: dict = {}


def scratch(elements: int, dtype: torch.dtype) -> torch.Tensor:
    """A work buffer of at least `elements`, kept and grown across calls: the one-call forwards carve their
    intermediates from it instead of allocating per token. They run one at a time and return nothing that points
    into it."""
    buf = _scratch.get(dtype)
    if buf is None or buf.numel() < elements:
        buf = _scratch[dtype] = torch.empty(elements, dtype=dtype)
    return buf


def _table(tensors: list, dtype: torch.dtype, what: str):
    # uint8: a block weight's self-describing buffer (native/block_gemm.py), whatever the activations' dtype.
    for t in tensors:
        if t is not None and (t.dtype not in (dtype, torch.uint8) or not t.is_cpu or not t.is_contiguous()):
            raise TypeError(f"the {what} takes contiguous {dtype} CPU weights, got {t.dtype}")
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() if t is not None else None for t in tensors])


def _same_kernel(projections, what: str) -> int:
    """The one kernel code (csrc/stack_common.h: 0 vectors, 1 AMX, 2 blocks) every projection's weight has."""
    kinds = {p.kernel for p in projections}
    if len(kinds) != 1:
        raise ValueError(f"the {what}'s projections must all be packed for one kernel")
    return kinds.pop()


class StackWeights:
    """The target's per-layer pointer table (csrc/decoder_stack.cpp's slot order: input norm, qkv, qkv bias, o, post
    norm, gate_up, down, q norm, k norm, attention-output norm, MLP-output norm; null where a model has none), built
    once; it keeps the tensors it points at alive."""

    def __init__(self, layers, final_norm: torch.Tensor):
        dtype = final_norm.dtype
        rows = [[lw.input_norm, lw.qkv.w, lw.qkv_bias, lw.o.w, lw.post_norm, lw.gate_up.w, lw.down.w, lw.q_norm,
                 lw.k_norm, lw.attn_out_norm, lw.mlp_out_norm] for lw in layers]
        self.keep = [t for row in rows for t in row if t is not None] + [final_norm]
        self.table = _table([t for row in rows for t in row], dtype, "decoder stack")
        self.kernel = _same_kernel([p for lw in layers for p in (lw.qkv, lw.o, lw.gate_up, lw.down)], "decoder stack")
        self.final_norm, self.num_layers, self.dtype = final_norm, len(layers), dtype
        self._ids: dict[tuple, torch.Tensor] = {}
        self._local: dict[tuple, torch.Tensor] = {}

    def local_layers(self, layers) -> torch.Tensor | None:
        """The sliding-window layers as the kernel reads them ([L] bytes), or None for none."""
        key = tuple(layers)
        if not key:
            return None
        if key not in self._local:
            flags = torch.zeros(self.num_layers, dtype=torch.uint8)
            flags[list(key)] = 1
            self._local[key] = flags
        return self._local[key]

    def aux_ids(self, layers: list[int]) -> torch.Tensor:
        """The feature layers as the kernel reads them (ascending, once each), made once per list."""
        key = tuple(layers)
        if key not in self._ids:
            self._ids[key] = torch.tensor(sorted(set(layers)), dtype=torch.int64)
        return self._ids[key]


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, dtype, need: int, what: str) -> None:
    if k_cache.dtype is not dtype or v_cache.dtype is not dtype or v_cache.stride() != k_cache.stride() \
            or k_cache.stride(-1) != 1:
        raise TypeError(f"the {what} takes {dtype} K and V caches of one layout")
    if need > k_cache.shape[-2]:
        raise RuntimeError(f"KV cache full: need {need} slots, capacity {k_cache.shape[-2]}")


def decoder_stack(lib, weights: StackWeights, *, spec, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  parts, aux_layers: list[int], local_rope=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [T, hidden] (updated in place to the last layer's output), cos/sin [T, D] (and local_rope, the
    sliding-window layers' cos/sin, where spec.local_layers lists any); parts (`kernel_api.Part`): the rows' requests
    in order, each with its KVCache ([L, Hkv, capacity, D] K and V), start, mask ([rows, start + rows] bool or None)
    and window mask -> (final-normed hidden [T, hidden], the aux layers' outputs [T, len(aux_layers) * hidden] or
    None). Every tensor in the weights' dtype."""
    dtype = weights.dtype
    t, hidden = x.shape
    if x.dtype is not dtype or not x.is_contiguous():
        raise TypeError(f"the decoder stack takes a contiguous {dtype} input, got {x.dtype}")
    part_table, cache_ptrs, mask_ptrs, keep = _part_table(parts, dtype, t, "decoder stack", layered=True)
    local_ptrs = _window_masks(parts, keep)
    cos, sin = cos.contiguous(), sin.contiguous()
    local = weights.local_layers(getattr(spec, "local_layers", ()))
    if local is not None and local_rope is None:
        raise ValueError("a model with sliding-window layers needs their RoPE tables")
    cos_l, sin_l = (r.contiguous() for r in local_rope) if local is not None else (None, None)
    keep += [cos_l, sin_l]
    ids = weights.aux_ids(aux_layers)
    aux = torch.empty(t, ids.numel() * hidden, dtype=dtype) if ids.numel() else None
    h = torch.empty(t, hidden, dtype=dtype)
    dims = (t, hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size)
    work = scratch(lib.stack_scratch(*dims), dtype)
    scale = getattr(spec, "attention_scale", None) or 1.0 / math.sqrt(spec.head_dim)
    rc = lib.decoder_stack(x.data_ptr(), weights.table, weights.num_layers, weights.final_norm.data_ptr(),
                           h.data_ptr(), cos.data_ptr(), sin.data_ptr(), _ptr(cos_l), _ptr(sin_l), _ptr(local),
                           len(parts), part_table.data_ptr(), cache_ptrs, mask_ptrs, local_ptrs, *dims,
                           spec.rms_norm_eps, scale, int(getattr(spec, "activation", "silu") == "gelu_tanh"),
                           ids.data_ptr(), ids.numel(), aux.data_ptr() if aux is not None else None, work.data_ptr(),
                           ops.is_bf16(x), weights.kernel, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"native decoder stack failed (code {rc}) for {t} rows in {len(parts)} parts")
    return h, aux


class DraftWeights:
    """The head's pointer table (csrc/draft_layer.cpp's slot order), built once; it keeps its tensors alive."""

    def __init__(self, head):
        projections = (head.qkv, head.o, head.gate_up, head.down, head.lm_head)
        row = [head.input_norm, head.hidden_norm, head.qkv.w, head.o.w, head.post_norm, head.gate_up.w,
               head.down.w, head.norm, head.lm_head.w]
        self.dtype = head.norm.dtype
        self.table = _table(row, self.dtype, "draft layer")
        self.kernel = _same_kernel(projections, "draft layer")
        self.keep, self.vocab = row, head.lm_head.out_features
        # norm_before_residual: the layer's residual is the normed feature (csrc/draft_layer.cpp's kNormedResidual)
        self.normed_residual = bool(getattr(head, "normed_residual", False))


def draft_layer(lib, weights: DraftWeights, *, spec, hidden: torch.Tensor, e: torch.Tensor, prenorm: bool,
                cos: torch.Tensor, sin: torch.Tensor, parts, last_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden, e [T, H]; cos/sin [T, D]; parts (`kernel_api.Part`): the rows' requests in order, each with its head
    KVCache ([1, Hkv, capacity, D]), start and mask ([rows, start + rows] bool or None) -> (draft logits [T, vocab],
    or [len(parts), vocab] for each part's last row with last_only; the layer's pre-norm output [T, H]). Every
    tensor in the weights' dtype."""
    dtype = weights.dtype
    t, n = hidden.shape
    hidden, e, cos, sin = hidden.contiguous(), e.contiguous(), cos.contiguous(), sin.contiguous()
    for name, x in (("hidden", hidden), ("embeddings", e), ("cos", cos), ("sin", sin)):
        if x.dtype is not dtype:
            raise TypeError(f"the draft layer takes {dtype} {name}, got {x.dtype}")
    table, caches, masks, keep = _part_table(parts, dtype, t, "draft layer", layered=False)
    out = torch.empty(t, n, dtype=dtype)
    logits = torch.empty(len(parts) if last_only else t, weights.vocab, dtype=dtype)
    dims = (t, n, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size)
    work = scratch(lib.draft_scratch(*dims), dtype)
    mode = int(prenorm) | (2 if weights.normed_residual else 0)  # csrc/draft_layer.cpp's kDoubleNorm, kNormedResidual
    rc = lib.draft_layer(weights.table, hidden.data_ptr(), e.data_ptr(), mode, cos.data_ptr(),
                         sin.data_ptr(), len(parts), table.data_ptr(), caches, masks, *dims, weights.vocab,
                         spec.rms_norm_eps, int(last_only), out.data_ptr(), logits.data_ptr(), work.data_ptr(),
                         ops.is_bf16(hidden), weights.kernel, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"native draft layer failed (code {rc}) for {t} rows in {len(parts)} parts")
    return logits, out


def _ptr(t: torch.Tensor | None):
    return t.data_ptr() if t is not None else None


def _window_masks(parts, keep: list):
    """Each part's sliding-window mask as the kernel reads it (null entries: the part's own mask), or None where no
    part has one; the byte masks join `keep`."""
    masks = [getattr(p, "window_mask", None) for p in parts]
    if all(m is None for m in masks):
        return None
    bytes_ = [ops.byte_mask(m, p.rows, p.start + p.rows) for m, p in zip(masks, parts)]
    keep += bytes_
    return (ctypes.c_void_p * len(parts))(*[_ptr(b) for b in bytes_])


def _part_table(parts, dtype, rows: int, what: str, layered: bool):
    """The parts as the compiled forwards read them: an int64 table (rows, start, then the cache's strides: layer,
    head and row for the target's [L, Hkv, capacity, D] caches, head and row for a head's), the caches' K and V
    pointers and the byte masks (kept alive by the returned list)."""
    if sum(p.rows for p in parts) != rows:
        raise ValueError(f"the parts hold {sum(p.rows for p in parts)} rows, the input {rows}")
    table, caches, masks, keep = [], [], [], []
    for p in parts:
        k, v = (p.cache.k, p.cache.v) if layered else (p.cache.k[0], p.cache.v[0])
        _check_cache(k, v, dtype, p.start + p.rows, what)
        m = ops.byte_mask(p.mask, p.rows, p.start + p.rows)
        keep.append(m)
        table += [p.rows, p.start, *(k.stride()[:-1])]
        caches += [k.data_ptr(), v.data_ptr()]
        masks.append(m.data_ptr() if m is not None else None)
    return (torch.tensor(table, dtype=torch.int64), (ctypes.c_void_p * len(caches))(*caches),
            (ctypes.c_void_p * len(masks))(*masks), keep)
