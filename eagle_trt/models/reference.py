"""The torch reference kernels: the decoder layer as torch operators, the oracle the compiled kernels are tested
against, and the engine wherever they are not available (no compiler, EAGLE_TRT_NATIVE=0, a GPU, float16).

    kernels = TorchKernels(torch.float32)
    h, aux = kernels.decoder_stack(kernels.target_weights(layers, norm), spec=spec, x=x, cos=cos, sin=sin,
                                   parts=[Part(cache, start, rows, mask)], aux_layers=[1])

Rows: fp32 takes torch's fused attention and its GEMMs, which sum a verify row in another order than a one-row call
(last-bit differences; `row_invariant` is False). bf16 takes float64 attention (products of bf16 inputs are exact
there and any summation order errs by ~2^-53, so the rounded result does not depend on the row count) and oneDNN's
prepacked projections, which up to 32 rows compute each row alone (`models/gemm.py` cuts larger calls): a verify
row then equals decoding its token, where the CPU has hardware bf16 for oneDNN (`row_invariant`).
"""

from __future__ import annotations

import torch

from eagle_trt.models import int8_reference
from eagle_trt.models.block_weights import BlockReference, BlockWeight
from eagle_trt.models.kernel_api import HeadStack, Kernels, TargetStack
from eagle_trt.models.gemm import INVARIANT_ROWS, Projection, bf16_hardware, prepack_enabled
from eagle_trt.models.layers import Rope, additive_mask, attention, attention_fp64, rms_norm, swiglu_mlp


def target_layers(layers, norm, spec, x, cos, sin, parts, aux_layers: list[int], attend, masks=None,
                  local_rope=None, local_masks=None):
    """The decoder stack as torch operators: x [T, hidden] embedded tokens of the parts' rows in order, cos/sin
    [T, D] (local_rope: the sliding-window layers' cos/sin); each part's K/V written to slots start.. of its own
    cache, and its rows attending through its mask (or `masks`, the parts' masks already in the form `attend` takes;
    a sliding-window layer through the parts' window masks, or `local_masks`) -> (final-normed hidden [T, hidden],
    the aux layers' outputs concatenated in layer order, or None)."""
    s = spec
    masks = masks if masks is not None else [p.mask for p in parts]
    if local_masks is None:
        local_masks = [p.window_mask if p.window_mask is not None else m for p, m in zip(parts, masks)]
    local = set(getattr(s, "local_layers", ()))
    bounds, row = [], 0
    for p in parts:
        bounds.append((row, row + p.rows))
        row += p.rows
    want, aux = set(aux_layers), []
    for i, lw in enumerate(layers):
        rope, ms = (local_rope, local_masks) if i in local else ((cos, sin), masks)
        q, k, v = _qkv(lw, s, rms_norm(x, lw.input_norm, s.rms_norm_eps), *rope)
        outs = []
        for p, m, (lo, hi) in zip(parts, ms, bounds):
            p.cache.write(i, p.start, k[:, lo:hi], v[:, lo:hi])
            kc, vc = p.cache.read(i, p.start + p.rows)
            outs.append(attend(q[:, lo:hi], kc, vc, m, getattr(s, "attention_scale", None)))
        o = lw.o(outs[0] if len(outs) == 1 else torch.cat(outs))
        x = x + (o if lw.attn_out_norm is None else rms_norm(o, lw.attn_out_norm, s.rms_norm_eps))
        m = swiglu_mlp(rms_norm(x, lw.post_norm, s.rms_norm_eps), lw.gate_up, lw.down,
                       getattr(s, "activation", "silu"))
        x = x + (m if lw.mlp_out_norm is None else rms_norm(m, lw.mlp_out_norm, s.rms_norm_eps))
        if i in want:
            aux.append(x)
    h = rms_norm(x, norm, s.rms_norm_eps)
    return h, (torch.cat(aux, dim=-1) if aux_layers else None)


def _qkv(lw, s, h, cos, sin):
    """One layer's q [H, T, D], k and v [Hkv, T, D] from its normed input h: the projection (+ bias), the q/k head
    norms where the model has them, RoPE on q and k."""
    t = h.shape[0]
    q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    qkv = lw.qkv(h)
    if lw.qkv_bias is not None:
        qkv = qkv + lw.qkv_bias
    qk = qkv[:, :q_out + kv_out].reshape(t, s.num_heads + s.num_kv_heads, s.head_dim)
    if lw.q_norm is not None:
        qk = torch.cat([rms_norm(qk[:, :s.num_heads], lw.q_norm, s.rms_norm_eps),
                        rms_norm(qk[:, s.num_heads:], lw.k_norm, s.rms_norm_eps)], dim=1)
    # RoPE on q and k heads together: [H + Hkv, T, D].
    q, k = Rope.rotate(qk.transpose(0, 1), cos, sin).split((s.num_heads, s.num_kv_heads))
    v = qkv[:, q_out + kv_out:].reshape(t, s.num_kv_heads, s.head_dim).transpose(0, 1)
    return q, k, v


def draft_layer(head, spec, hidden, e, prenorm: bool, cos, sin, parts, last_only: bool, attend):
    """The EAGLE-3 head's layer as torch operators: hidden, e [T, H] (features, token embeddings) of the parts' rows
    -> (draft logits [T, vocab], or each part's last row with last_only; the layer's pre-norm output [T, H]). Each
    part's K/V go to slots start.. of its own head cache."""
    s, eps = spec, spec.rms_norm_eps
    t = hidden.shape[0]
    h_in = rms_norm(hidden, head.input_norm, eps) if prenorm else hidden
    normed = rms_norm(h_in, head.hidden_norm, eps)
    # norm_before_residual heads (speculators'): the layer's residual is the normed feature, not the feature
    residual = normed if getattr(head, "normed_residual", False) else hidden
    x = torch.cat([rms_norm(e, head.input_norm, eps), normed], -1)
    q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    q, k, v = head.qkv(x).split((q_out, kv_out, kv_out), dim=-1)
    q = Rope.rotate(q.reshape(t, s.num_heads, s.head_dim).transpose(0, 1), cos, sin)
    k = Rope.rotate(k.reshape(t, s.num_kv_heads, s.head_dim).transpose(0, 1), cos, sin)
    v = v.reshape(t, s.num_kv_heads, s.head_dim).transpose(0, 1)
    outs, lasts, row = [], [], 0
    for p in parts:
        lo, hi = row, row + p.rows
        p.cache.write(0, p.start, k[:, lo:hi], v[:, lo:hi])
        kc, vc = p.cache.read(0, p.start + p.rows)
        outs.append(attend(q[:, lo:hi], kc, vc, p.mask))
        lasts.append(hi - 1)
        row = hi
    out = residual + head.o(outs[0] if len(outs) == 1 else torch.cat(outs))
    out = out + swiglu_mlp(rms_norm(out, head.post_norm, eps), head.gate_up, head.down)
    logits = head.lm_head(rms_norm(out[lasts] if last_only else out, head.norm, eps))
    return logits, out


class TorchKernels:
    """The decoder layer on torch operators (see the module docstring); `reason` says why the compiled kernels do
    not serve, when they were wanted."""

    name = "torch"

    def __init__(self, dtype: torch.dtype, device: torch.device | str = "cpu", reason: str | None = None,
                 block_compute: str = "float"):
        self.dtype, self.device, self.reason = dtype, torch.device(device), reason
        self.block_compute = block_compute  # float: gguf-py's de-quantized weights; int8: `Int8Reference`
        # The target's attention: float64 but for fp32 (see the module docstring).
        self.attend = attention if dtype == torch.float32 else attention_fp64
        self.row_invariant = (dtype == torch.bfloat16 and self.device.type == "cpu" and prepack_enabled()
                              and bf16_hardware())
        self.lm_head_rows = INVARIANT_ROWS

    def projection(self, w):
        """A float weight [in, out] on torch's GEMMs; a BlockWeight de-quantized once (`BlockReference`), or with
        int8 activations (`Int8Reference`) where block_compute is int8 and its formats have that path."""
        if isinstance(w, BlockWeight):
            if self.block_compute == "int8" and int8_reference.supports(w):
                return int8_reference.Int8Reference(w)
            return BlockReference(w)
        return Projection(w)

    # ---- the runtime weight cache (models/weight_cache.py): the [in, out] layout; oneDNN packs it at load ----
    @property
    def cache_key(self) -> str:
        blocks = "-int8" if self.block_compute == "int8" else ""
        return f"torch-{str(self.dtype).removeprefix('torch.')}{blocks}"

    @staticmethod
    def projection_state(proj) -> tuple[torch.Tensor, dict]:
        # A block weight's reference is its de-quantized fp32 [in, out] weight (gguf-py's values), or for int8 its
        # blocks as the kernels' buffer holds them.
        if isinstance(proj, int8_reference.Int8Reference):
            return proj.state()
        return proj.w, {"in": proj.in_features, "out": proj.out_features,
                        **({"dequantized": True} if isinstance(proj, BlockReference) else {})}

    def projection_from_state(self, w: torch.Tensor, meta: dict):
        if meta.get("int8_segments"):
            return int8_reference.Int8Reference.from_state(w, meta)
        if meta.get("dequantized"):
            return BlockReference.from_dequantized(w)
        return Projection(w)

    def fitted(self, inputs) -> Kernels:
        return self

    def target_weights(self, layers, norm) -> TargetStack:
        return TargetStack(layers, norm)

    def decoder_stack(self, weights: TargetStack, *, spec, x, cos, sin, parts, aux_layers, local_rope=None):
        masks = local_masks = None
        if self.attend is attention_fp64:  # its additive form, made once for every layer
            groups = spec.num_heads // spec.num_kv_heads

            def additive(m):
                return additive_mask(m, groups) if m is not None else None

            masks = [additive(p.mask) for p in parts]
            local_masks = [additive(p.window_mask) if p.window_mask is not None else m for p, m in zip(parts, masks)]
        return target_layers(weights.layers, weights.norm, spec, x, cos, sin, parts, aux_layers, self.attend, masks,
                             local_rope, local_masks)

    def draft_weights(self, head) -> HeadStack:
        return HeadStack(head)

    def draft_layer(self, weights: HeadStack, *, spec, hidden, e, prenorm, cos, sin, parts, last_only):
        # The head only proposes: torch's fused attention serves it in every dtype.
        return draft_layer(weights.head, spec, hidden, e, prenorm, cos, sin, parts, last_only, attention)

    def greedy(self, lm_head, hidden: torch.Tensor) -> torch.Tensor:
        return lm_head(hidden).argmax(dim=-1)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.log_softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
