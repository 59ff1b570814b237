"""Q4_K and Q6_K blocks made as llama.cpp's reference quantizers make them (ggml-quants.c `quantize_row_q4_K_ref`
and `quantize_row_q6_K_ref`, what `llama-quantize` runs without an importance matrix), byte for byte.

    from eagle_trt.quant_k import quantize_q4_k, quantize_q6_k
    data = quantize_q4_k(blocks)           # blocks: float32 [n, 256] -> uint8 [n, 144]
    data = quantize_q6_k(blocks)           # -> uint8 [n, 210]

Q4_K: every sub-block of 32 weights gets a scale and a min from a weighted least-squares search over 21 candidate
grids (`make_qkx2_quants`); the eight scales and mins of a super-block are then quantized to 6 bits against the
largest. Q6_K: every 16 weights get a symmetric scale from a search over 19 grids weighted by x² (`make_qx_quants`),
the sixteen scales quantized to int8 against the largest in magnitude.

The C code accumulates its sums element by element in float32, rounding each product on its own (ggml-base is
built without -march=native, so nothing is contracted into an FMA on x86-64); here a group's weights are the rows
of a [group, S] tensor, products are taken whole and the sums row by row in the C order, so every sum rounds as
the C one does.
"""

from __future__ import annotations

import torch

_NMAX, _RMIN, _RDELTA, _NSTEP = 15.0, -1.0, 0.1, 20


def _f32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


def _nearest_int(f: torch.Tensor) -> torch.Tensor:
    """ggml's nearest_int: f + 1.5·2^23 in float32, i.e. round half to even for |f| < 2^22."""
    return torch.round(f).to(torch.int32)


def _seq_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over the 32 rows of t [32, S], top to bottom, in float32 (C's `s += t[i]` loop); [S]."""
    s = t[0]
    for i in range(1, t.shape[0]):
        s = s + t[i]
    return s


def _sq_error(scale, mn, L, x, w):
    """Σ_i w·(scale·L + min − x)², left to right; L, x, w [32, S], scale and min [S]."""
    diff = scale * L + mn - x
    return _seq_sum(w * (diff * diff))


def _qkx2(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """make_qkx2_quants(32, 15, x, w, ..., -1, 0.1, 20, false) for each column of x [32, S]: (scale, -min, L).
    Products are exact per element whatever the layout; only the sums need C's order, which _seq_sum keeps."""
    lo = torch.clamp(x.amin(dim=0), max=0.0)  # min and max are exact whatever the order; min is kept <= 0
    hi = x.amax(dim=0)
    sum_w = _seq_sum(w)
    sum_x = _seq_sum(w * x)
    flat = hi == lo
    span = torch.where(flat, torch.ones_like(hi), hi - lo)
    iscale = _f32(_NMAX) / span
    scale = 1.0 / iscale
    L = _nearest_int(iscale * (x - lo)).clamp(0, 15).float()
    best = _sq_error(scale, lo, L, x, w)
    mn = lo
    for step in range(_NSTEP + 1):
        # As in the C code, each candidate grid starts from the best min found so far, not the sub-block's own.
        span = torch.where(flat, torch.ones_like(hi), hi - mn)
        iscale = ((_f32(_RMIN) + _f32(_RDELTA) * step) + _NMAX) / span
        la = _nearest_int(iscale * (x - mn)).clamp(0, 15).float()
        wl = w * la
        sum_l, sum_l2, sum_xl = _seq_sum(wl), _seq_sum(wl * la), _seq_sum(wl * x)
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
        L = torch.where(better, la, L)
        scale = torch.where(better, this_scale, scale)
        mn = torch.where(better, this_min, mn)
    # A flat sub-block (max == min) returns early in C: scale 0, levels 0, min as found.
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    mn = torch.where(flat, lo, mn)
    L = torch.where(flat, torch.zeros_like(L), L)
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
    # Super-blocks are independent: a bounded chunk keeps the [32, S] temporaries small.
    chunk = 8192
    return torch.cat([_quantize_chunk(blocks[i:i + chunk]) for i in range(0, blocks.shape[0], chunk)])


def _quantize_chunk(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    x = blocks.reshape(n * 8, 32).t().contiguous()  # [32, S]: weight i of every sub-block is one contiguous row
    # sqrt in float64, then rounded once: correctly rounded like C's sqrtf (torch's float32 sqrt can be 1 ulp off).
    w = torch.sqrt((_seq_sum(x * x) / 32).double()).float() + x.abs()
    scales, mins, L = _qkx2(x, w)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    L = L.t().reshape(n, 8, 32)
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
    final = _nearest_int((blocks.reshape(n, 8, 32) + dm[:, :, None]) / safe[:, :, None]).clamp(0, 15)
    L = torch.where((d == 0)[:, :, None], L.to(torch.int32), final)
    q = L.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128).to(torch.uint8)
    head = torch.cat([d16.view(torch.uint8).reshape(n, 2), dmin16.view(torch.uint8).reshape(n, 2)], dim=1)
    return torch.cat([head, _pack_scales(ls, lm), qs], dim=1)


_EPS = 1e-15  # GROUP_MAX_EPS: a group whose largest magnitude is below it is all zeros
_QX_STEPS = (*range(-9, 0), *range(1, 10))  # make_qx_quants' candidate grids: nmax + 0.1·step levels


def _signed_absmax(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(|max|, the signed value of largest magnitude) along `dim`, the first of equals as C's `if (ax > amax)`."""
    i = x.abs().argmax(dim=dim, keepdim=True)
    v = torch.gather(x, dim, i).squeeze(dim)
    return v.abs(), v


def _qx_sums(iscale: torch.Tensor, x: torch.Tensor, w: torch.Tensor):
    """Levels l = clamp(round(iscale·x), −32, 31) and Σ w·x·l, Σ w·l·l in C's order; x, w [16, S]."""
    l = _nearest_int(iscale * x).clamp(-32, 31).float()
    return l, _seq_sum(w * x * l), _seq_sum(w * l * l)


def _qx(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """make_qx_quants(16, 32, x, L, rmse_type=1, NULL) for each column of x [16, S]: (scale [S], L [16, S] 0..63)."""
    amax, mx = _signed_absmax(x, 0)
    zero = amax < _EPS
    mx = torch.where(zero, torch.ones_like(mx), mx)
    w = x * x
    l, sumlx, suml2 = _qx_sums(_f32(-32.0) / mx, x, w)
    scale = torch.where(suml2 != 0, sumlx / torch.where(suml2 != 0, suml2, torch.ones_like(suml2)),
                        torch.zeros_like(suml2))
    best = scale * sumlx
    L = l + 32
    for step in _QX_STEPS:
        l, sumlx, suml2 = _qx_sums(-(32 + _f32(0.1) * step) / mx, x, w)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        this_scale = sumlx / torch.where(better, suml2, torch.ones_like(suml2))
        L = torch.where(better, l + 32, L)
        scale = torch.where(better, this_scale, scale)
        best = torch.where(better, this_scale * sumlx, best)
    scale = torch.where(zero, torch.zeros_like(scale), scale)
    return scale, torch.where(zero, torch.zeros_like(L), L)


def quantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """float32 [n, 256] -> uint8 [n, 210], the bytes quantize_row_q6_K_ref writes."""
    chunk = 8192
    return torch.cat([_q6_k_chunk(blocks[i:i + chunk]) for i in range(0, blocks.shape[0], chunk)])


def _q6_k_chunk(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    x = blocks.reshape(n * 16, 16).t().contiguous()  # [16, S]
    scales, L = _qx(x)
    scales, L = scales.reshape(n, 16), L.t().reshape(n, 16, 16).to(torch.int32)
    max_abs, max_scale = _signed_absmax(scales, 1)
    zero = max_abs < _EPS  # the whole super-block is stored as zeros
    iscale = _f32(-128.0) / torch.where(zero, torch.ones_like(max_scale), max_scale)
    d16 = torch.where(zero, torch.zeros_like(iscale), 1.0 / iscale).half()
    sc = _nearest_int(iscale[:, None] * scales).clamp(max=127)
    d = d16.float()[:, None] * sc.float()
    final = _nearest_int(blocks.reshape(n, 16, 16) / torch.where(d == 0, torch.ones_like(d), d)[:, :, None])
    L = torch.where((d == 0)[:, :, None], L, final.clamp(-32, 31) + 32).reshape(n, 2, 4, 32)  # [half, quarter, l]
    ql = torch.cat([L[:, :, 0] & 0xF | ((L[:, :, 2] & 0xF) << 4), L[:, :, 1] & 0xF | ((L[:, :, 3] & 0xF) << 4)], 2)
    qh = (L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)
    out = torch.cat([ql.reshape(n, 128), qh.reshape(n, 64), sc.to(torch.int8).view(torch.uint8)], dim=1)
    out = torch.cat([out.to(torch.uint8), d16.view(torch.uint8).reshape(n, 2)], dim=1)
    return torch.where(zero[:, None], torch.zeros_like(out), out)
