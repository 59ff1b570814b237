"""Q4_K blocks made as llama.cpp's reference quantizer makes them (ggml-quants.c `quantize_row_q4_K_ref`, the one
`llama-quantize` runs without an importance matrix), byte for byte.

    from eagle_trt.quant_k import quantize_q4_k
    data = quantize_q4_k(blocks)           # blocks: float32 [n, 256] -> uint8 [n, 144]

Every sub-block of 32 weights gets a scale and a min from a weighted least-squares search over 21 candidate grids
(`make_qkx2_quants`); the eight scales and mins of a super-block are then quantized to 6 bits against the largest.
The C code accumulates its sums element by element in float32, rounding each product on its own (ggml-base is
built without -march=native, so nothing is contracted into an FMA on x86-64); the loops below run over the 32
elements in that order, vectorised across all sub-blocks, so every sum rounds as the C one does.
"""

from __future__ import annotations

import torch

_NMAX, _RMIN, _RDELTA, _NSTEP = 15.0, -1.0, 0.1, 20


def _f32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


def _nearest_int(f: torch.Tensor) -> torch.Tensor:
    """ggml's nearest_int: f + 1.5·2^23 in float32, i.e. round half to even for |f| < 2^22."""
    return torch.round(f).to(torch.int32)


def _seq_sum(terms) -> torch.Tensor:
    """Σ over the 32 columns, left to right, in float32 (C's `s += t` loop)."""
    s = None
    for t in terms:
        s = t if s is None else s + t
    return s


def _sq_error(scale, mn, L, x, w):
    """Σ w·(scale·L + min − x)², left to right."""
    def term(i):
        diff = scale * L[:, i] + mn - x[:, i]
        return w[:, i] * (diff * diff)
    return _seq_sum(term(i) for i in range(32))


def _qkx2(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """make_qkx2_quants(32, 15, x, w, ..., -1, 0.1, 20, false) for each row of x [S, 32]: (scale, -min, L)."""
    lo = torch.clamp(x.amin(dim=1), max=0.0)  # min and max are exact whatever the order; min is kept <= 0
    hi = x.amax(dim=1)
    sum_w = _seq_sum(w[:, i] for i in range(32))
    sum_x = _seq_sum(w[:, i] * x[:, i] for i in range(32))
    flat = hi == lo
    span = torch.where(flat, torch.ones_like(hi), hi - lo)
    iscale = _f32(_NMAX) / span
    scale = 1.0 / iscale
    L = _nearest_int(iscale[:, None] * (x - lo[:, None])).clamp(0, 15).float()
    best = _sq_error(scale, lo, L, x, w)
    mn = lo
    for step in range(_NSTEP + 1):
        # As in the C code, each candidate grid starts from the best min found so far, not the sub-block's own.
        span = torch.where(flat, torch.ones_like(hi), hi - mn)
        iscale = ((_f32(_RMIN) + _f32(_RDELTA) * step) + _NMAX) / span
        la = _nearest_int(iscale[:, None] * (x - mn[:, None])).clamp(0, 15).float()
        sum_l = _seq_sum(w[:, i] * la[:, i] for i in range(32))
        sum_l2 = _seq_sum(w[:, i] * la[:, i] * la[:, i] for i in range(32))
        sum_xl = _seq_sum(w[:, i] * la[:, i] * x[:, i] for i in range(32))
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        safe_d = torch.where(ok, D, torch.ones_like(D))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe_d
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe_d
        pos = this_min > 0
        this_min = torch.where(pos, torch.zeros_like(this_min), this_min)
        this_scale = torch.where(pos, sum_xl / sum_l2, this_scale)
        error = _sq_error(this_scale, this_min, la, x, w)
        better = ok & (error < best)
        best = torch.where(better, error, best)
        L = torch.where(better[:, None], la, L)
        scale = torch.where(better, this_scale, scale)
        mn = torch.where(better, this_min, mn)
    # A flat sub-block (max == min) returns early in C: scale 0, levels 0, min as found.
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    mn = torch.where(flat, lo, mn)
    L = torch.where(flat[:, None], torch.zeros_like(L), L)
    return scale, -mn, L


def _pack_scales(ls: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and mins [n, 8] -> the 12 bytes of a q4_k/q5_k block (see quant_blocks._scale_min_k4)."""
    out = torch.zeros(ls.shape[0], 12, dtype=torch.int32)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out.to(torch.uint8)


def quantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """float32 [n, 256] -> uint8 [n, 144], the bytes quantize_row_q4_K_ref writes."""
    n = blocks.shape[0]
    x = blocks.reshape(n * 8, 32)
    sum_x2 = _seq_sum(x[:, i] * x[:, i] for i in range(32))
    # sqrt in float64, then rounded once: correctly rounded like C's sqrtf (torch's float32 sqrt can be 1 ulp off).
    w = torch.sqrt((sum_x2 / 32).double()).float()[:, None] + x.abs()
    scales, mins, L = _qkx2(x, w)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    # max_scale / max_min start at 0 and take a value only if it is larger (so negatives and NaN never win).
    max_scale, max_min = scales.amax(dim=1), mins.amax(dim=1)
    max_scale = torch.where(max_scale > 0, max_scale, torch.zeros_like(max_scale))  # -0.0 and NaN become +0
    max_min = torch.where(max_min > 0, max_min, torch.zeros_like(max_min))
    inv_scale = torch.where(max_scale > 0, _f32(63.0) / max_scale, torch.zeros_like(max_scale))
    inv_min = torch.where(max_min > 0, _f32(63.0) / max_min, torch.zeros_like(max_min))
    ls = (_nearest_int(inv_scale[:, None] * scales) & 0xFF).clamp(max=63)  # C: uint8_t, then MIN(63, ·)
    lm = (_nearest_int(inv_min[:, None] * mins) & 0xFF).clamp(max=63)
    d16, dmin16 = (max_scale / 63.0).half(), (max_min / 63.0).half()
    # The final levels use the 6-bit scales as stored; a sub-block whose scale is 0 keeps the search's levels.
    d = d16.float()[:, None] * ls.float()
    dm = dmin16.float()[:, None] * lm.float()
    safe = torch.where(d == 0, torch.ones_like(d), d)
    final = _nearest_int((x.reshape(n, 8, 32) + dm[:, :, None]) / safe[:, :, None]).clamp(0, 15)
    L = torch.where((d == 0)[:, :, None], L.reshape(n, 8, 32).to(torch.int32), final)
    q = L.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128).to(torch.uint8)
    head = torch.cat([d16.view(torch.uint8).reshape(n, 2), dmin16.view(torch.uint8).reshape(n, 2)], dim=1)
    return torch.cat([head, _pack_scales(ls, lm), qs], dim=1)
