"""Building blocks shared by the target and the draft head: RMSNorm, RoPE, attention, MLP.

Shapes: T = tokens in this forward, S = cache entries visible (prefix + T), H = heads, D = head_dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as HF's LlamaRMSNorm (variance in fp32, scale after) so fp32 results agree bit for bit
    # with transformers where it matters for greedy ties.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        # Llama 3.x: leave high frequencies, divide low ones by `factor`, blend in between.
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(is_mid, mid, scaled)
    raise NotImplementedError(f"rope scaling type {kind!r} is not supported by the torch engine")


class Rope:
    """cos/sin tables for positions [0, max_positions)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int, dtype):
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
        self.cos = emb.cos().to(dtype)
        self.sin = emb.sin().to(dtype)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows [T, D] for these positions (gather once per forward, reuse in every layer)."""
        return self.cos[positions], self.sin[positions]

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [heads, T, D]; cos/sin: [T, D]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [H, T, D]; positions: [T]
        return self.rotate(x, *self.tables(positions))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              scale: float | None = None) -> torch.Tensor:
    """q: [H, T, D], k/v: [Hkv, S, D], mask: [T, S] bool (True = visible) or None (all visible); scale: the scores'
    factor (None: D^-0.5).

    Returns [T, H*D]."""
    h, t, d = q.shape
    out = F.scaled_dot_product_attention(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, enable_gqa=k.shape[0] != h, scale=scale
    )
    return out[0].transpose(0, 1).reshape(t, h * d)


def attention_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   scale: float | None = None) -> torch.Tensor:
    """Same contract as `attention`, computed in float64 and rounded once to q's dtype at the end.

    Why: a fused attention kernel sums each row in an order that depends on how many query rows the call
    has and where masked keys sit, so a tree-verify row and the one-token decode of the same position can
    differ in the last bit. In bf16 that bit is often visible in the output and, through near-ties, in
    the greedy token. In float64 every product of bf16/fp32 inputs is exact and the rounding error of
    any summation order is ~2^-53, far below one bf16 or fp32 ulp, so the rounded result does not depend
    on the row count or the key layout. tests/test_gemm.py checks that a T-token forward then equals
    T one-token forwards bit for bit.
    """
    h, t, d = q.shape
    hkv = k.shape[0]
    g = h // hkv
    qd, kt = q.double().reshape(hkv, g * t, d), k.double().transpose(1, 2)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if mask is None:
        scores = torch.bmm(qd, kt).mul_(scale)  # [Hkv, G*T, S]
    else:
        # Scale, product and mask in one call: the bias adds 0 (visible) or -inf (hidden).
        bias = mask if mask.dtype == torch.float64 else additive_mask(mask, g)
        scores = torch.baddbmm(bias, qd, kt, alpha=scale)
    out = torch.bmm(torch.softmax(scores, dim=-1), v.double())  # [Hkv, G*T, D]
    return out.view(h, t, d).to(q.dtype).transpose(0, 1).reshape(t, h * d)


def additive_mask(mask: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """bool [T, S] (True = visible) -> float64 [groups * T, S] of 0 / -inf, the form `attention_fp64` adds to
    its scores (rows ordered group-major, as it lays out the query heads sharing a KV head). A forward makes
    it once and passes it to every layer."""
    bias = torch.zeros(mask.shape, dtype=torch.float64).masked_fill_(~mask, float("-inf"))
    return bias.repeat(groups, 1) if groups > 1 else bias


def swiglu_mlp(x: torch.Tensor, gate_up, down, activation: str = "silu") -> torch.Tensor:
    # gate_up: Projection [H, 2I] (gate columns, then up), fused so one GEMM reads both; down: [I, H]. activation:
    # silu, or gelu_tanh (Gemma 3's gelu_pytorch_tanh).
    gu = gate_up(x)
    gate, up = gu.chunk(2, dim=-1)
    act = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
    return down(act * up)


def window_mask(mask: torch.Tensor | None, key_positions: torch.Tensor, positions: torch.Tensor,
                window: int) -> torch.Tensor | None:
    """A sliding-window layer's mask: `mask` ([T, S] bool, None: all visible) less the keys a query at position p
    does not see, those at positions <= p - window (transformers' sliding window); None where it hides no key.
    key_positions [S]: the position each cache slot holds (`KVCache.positions`), so a tree row sees its ancestors
    only inside the window, as when its token is decoded alone."""
    inside = key_positions[None, :] > positions[:, None] - window  # [T, S]
    if bool(inside.all()):
        return None
    return inside if mask is None else mask & inside


def embed(table: torch.Tensor, tokens: torch.Tensor, scale: float | None) -> torch.Tensor:
    """Token embeddings [T, hidden], times `scale` in the table's dtype where the model scales them (Gemma 3: the
    factor rounded to the dtype first, as transformers does)."""
    x = table[tokens]
    return x if scale is None else x * torch.tensor(scale, dtype=torch.float32).to(table.dtype)
