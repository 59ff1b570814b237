// The bf16 decoder layer's small per-row operations, fused: residual add + RMSNorm, RoPE + KV-cache write, and
// SiLU(gate) * up. In torch each is five to fifteen operator calls a layer, each with its own dispatch and temporary
// tensors; at one token a forward spends more time there than in the attention, and the cost grows with the rows of
// a tree-verify pass.
//
// Every output row is a function of that row's inputs alone, computed in an order fixed by the row length (a
// verify row gives the same bits as decoding that token alone, as the GEMMs and the attention kernel do). The
// element-wise steps round to bf16 where torch's bf16 operators round (after each add or multiply), so RoPE and
// the residual adds give torch's bits; the norm's sum of squares and SiLU's exp are this file's own, fixed order.
//
// The Python side (eagle_trt/models/native_ops.py) calls these through ctypes; native.py compiles them.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "simd.h"

namespace {

using namespace eagle_trt;

// Rows below which a call stays on the calling thread: one decoding row takes less time than waking the pool's
// threads; a 16-row verify pass gains from the split (`kernel_timings.py --parts`: about 0.3 ms a forward at 8
// against 64). The split changes no bit: rows are independent.
constexpr int64_t kParallelRows = 8;

inline float bf(uint16_t h) { return bf16_to_float(h); }

inline float round_bf16(float f) { return bf(to_bf16(f)); }

inline vf vround_bf16(vf f) {
    const vu32 u = vround_bits(f) << 16;
    vf r;
    std::memcpy(&r, &u, sizeof r);
    return r;
}

// One row of x (+= delta) and its RMSNorm times w into h. n need not be a multiple of the lane count.
void add_norm_row(uint16_t* x, const uint16_t* delta, const uint16_t* w, uint16_t* h, int n, float eps) {
    vf acc = vf{};
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        vf v = vload_bf16(x + i);
        if (delta) {
            v = vround_bf16(v + vload_bf16(delta + i));
            vstore_bf16(x + i, v);
        }
        acc = acc + v * v;
    }
    float tail = 0.0f;
    for (; i < n; ++i) {
        float v = bf(x[i]);
        if (delta) {
            v = round_bf16(v + bf(delta[i]));
            x[i] = to_bf16(v);
        }
        tail = tail + v * v;
    }
    const float r = 1.0f / std::sqrt((lane_sum(acc) + tail) / static_cast<float>(n) + eps);
    for (i = 0; i + kLanes <= n; i += kLanes)
        vstore_bf16(h + i, vload_bf16(w + i) * vround_bf16(vload_bf16(x + i) * r));
    for (; i < n; ++i) h[i] = to_bf16(bf(w[i]) * round_bf16(bf(x[i]) * r));
}

// RoPE of one head vector (D elements) into dst: x * cos + rotate_half(x) * sin, each product and the sum rounded
// to bf16 as torch's bf16 operators do.
void rope_head(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, int D, uint16_t* dst) {
    const int half = D / 2;
    for (int j = 0; j < D; ++j) {
        const float rot = j < half ? -bf(x[j + half]) : bf(x[j - half]);
        dst[j] = to_bf16(round_bf16(bf(x[j]) * bf(cos[j])) + round_bf16(rot * bf(sin[j])));
    }
}

// silu(g) * u per element: silu rounded to bf16, then the product (torch's two bf16 operators).
// silu(g) = g * e / (1 + e) with e = exp(g) for g < 0, and g / (1 + exp(-g)) otherwise: exp only of values <= 0.
inline vf vsilu(vf g) {
    const vf neg = g < 0 ? g : -g;
    const vf e = vexp(neg);
    return (g < 0 ? g * e : g) / (e + 1.0f);
}

}  // namespace

extern "C" {

// x: [T, n] bf16, updated in place to x + delta (delta null: unchanged); h: [T, n] = RMSNorm(x) * w. Rows are
// independent: threads split rows, never a row.
int eagle_trt_add_rms_norm(uint16_t* x, const uint16_t* delta, const uint16_t* w, uint16_t* h, int64_t T, int64_t n,
                           float eps, int threads) {
    if (n <= 0) return -2;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (threads > 1 && T >= kParallelRows) schedule(static)
    for (int64_t t = 0; t < T; ++t)
        add_norm_row(x + t * n, delta ? delta + t * n : nullptr, w, h + t * n, static_cast<int>(n), eps);
    return 0;
}

// qkv: [T, (H + 2 Hkv) D] bf16 (q heads, then k, then v), plus bias [(H + 2 Hkv) D] or null; cos, sin: [T, D].
// Writes q rotated to q_out [H, T, D]; k rotated and v as they are to the cache at rows start .. start+T-1
// (k_cache / v_cache point at the layer's [Hkv, capacity, D] block; strides in elements per head, per row).
int eagle_trt_rope_qkv(const uint16_t* qkv, const uint16_t* bias, const uint16_t* cos, const uint16_t* sin,
                       uint16_t* q_out, uint16_t* k_cache, int64_t k_sh, int64_t k_sr, uint16_t* v_cache, int64_t v_sh,
                       int64_t v_sr, int64_t start, int64_t T, int64_t H, int64_t Hkv, int64_t D, int threads) {
    if (D <= 0 || D % 2 || D > 1024) return -2;
    const int64_t width = (H + 2 * Hkv) * D;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (threads > 1 && T >= kParallelRows) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        uint16_t row[8192 + 3 * 1024];
        const uint16_t* src = qkv + t * width;
        if (bias) {
            if (width > static_cast<int64_t>(sizeof row / sizeof row[0])) continue;  // checked in Python
            for (int64_t i = 0; i < width; ++i) row[i] = to_bf16(bf(src[i]) + bf(bias[i]));
            src = row;
        }
        const uint16_t* c = cos + t * D;
        const uint16_t* s = sin + t * D;
        for (int64_t hq = 0; hq < H; ++hq) rope_head(src + hq * D, c, s, D, q_out + (hq * T + t) * D);
        for (int64_t hk = 0; hk < Hkv; ++hk) {
            rope_head(src + (H + hk) * D, c, s, D, k_cache + hk * k_sh + (start + t) * k_sr);
            std::memcpy(v_cache + hk * v_sh + (start + t) * v_sr, src + (H + Hkv + hk) * D, D * sizeof(uint16_t));
        }
    }
    return 0;
}

// gu: [T, 2I] bf16 (gate columns, then up); out: [T, I] = silu(gate) * up.
int eagle_trt_silu_mul(const uint16_t* gu, uint16_t* out, int64_t T, int64_t I, int threads) {
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (threads > 1 && T >= kParallelRows) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const uint16_t* g = gu + t * 2 * I;
        const uint16_t* u = g + I;
        uint16_t* o = out + t * I;
        int64_t i = 0;
        for (; i + kLanes <= I; i += kLanes)
            vstore_bf16(o + i, vround_bf16(vsilu(vload_bf16(g + i))) * vload_bf16(u + i));
        for (; i < I; ++i) {
            vf g1 = vf{} + bf(g[i]);
            o[i] = to_bf16(round_bf16(vsilu(g1)[0]) * bf(u[i]));
        }
    }
    return 0;
}

// x: [T, n] bf16 -> out[t] = index of the largest value of row t, the first one on ties; NaN counts as the largest
// (as torch.argmax). Lane-wise maxima over the row, then the first index holding the maximum.
int eagle_trt_argmax(const uint16_t* x, int64_t T, int64_t n, int64_t* out) {
    if (n <= 0) return -2;
    for (int64_t t = 0; t < T; ++t) {
        const uint16_t* row = x + t * n;
        float best = bf(row[0]);
        bool nan = best != best;
        int64_t i = 0;
        if (n >= kLanes) {
            vf m = vload_bf16(row);
            vi odd = m != m;
            for (i = kLanes; i + kLanes <= n; i += kLanes) {
                const vf v = vload_bf16(row + i);
                m = v > m ? v : m;
                odd |= v != v;
            }
            for (int l = 0; l < kLanes; ++l) {
                best = m[l] > best ? m[l] : best;
                nan = nan || odd[l];
            }
        }
        for (; i < n; ++i) {
            const float v = bf(row[i]);
            best = v > best ? v : best;
            nan = nan || v != v;
        }
        int64_t at = 0;
        if (nan) {
            while (bf(row[at]) == bf(row[at])) ++at;  // NaN: torch reports the first one
        } else {
            while (bf(row[at]) != best) ++at;
        }
        out[t] = at;
    }
    return 0;
}

}  // extern "C"
