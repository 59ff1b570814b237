// The decoder layer's small per-row operations, fused: residual add + RMSNorm, RoPE + KV-cache write, and
// SiLU(gate) * up, for fp32 and bf16 activations alike. In torch each is five to fifteen operator calls a layer, each
// with its own dispatch and temporary tensors; at one token a forward spends more time there than in the attention,
// and the cost grows with the rows of a tree-verify pass.
//
// Every output row is a function of that row's inputs alone, computed in an order fixed by the row length (a
// verify row gives the same bits as decoding that token alone, as the projections and the attention kernel do).
// In bf16 the element-wise steps round where torch's bf16 operators round (after each add or multiply), so RoPE and
// the residual adds give torch's bits; fp32 is the same code without those roundings (simd.h, Elem). The norm's sum
// of squares and SiLU's exp are this file's own, fixed order.
//
// The Python side (eagle_trt/models/native/) calls these through ctypes and builds them.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "simd.h"

namespace {

using namespace eagle_trt;

// Rows below which a call stays on the calling thread: one decoding row takes less time than waking the pool's
// threads, and a 16-row verify pass gains from the split (docs/bench.md, `kernel_timings.py --parts`). The split
// changes no bit: rows are independent.
constexpr int64_t kParallelRows = 8;
// The RoPE kernel stages a biased qkv row on its stack: (heads + 2 kv heads) * head_dim up to this many elements.
constexpr int64_t kMaxBiasedRow = 8192 + 3 * 1024;

// One row of x (+= delta) and its RMSNorm times w into h. n need not be a multiple of the lane count.
template <typename T>
void add_norm_row(T* x, const T* delta, const T* w, T* h, int n, float eps, bool mutate = false) {
    using E = Elem<T>;
    vf acc = vf{};
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        vf v = E::load(x + i);
        if (delta) {
            v = E::round(v + E::load(delta + i));
            E::store(x + i, v);
        }
        acc = acc + v * v;
    }
    float tail = 0.0f;
    for (; i < n; ++i) {
        float v = E::get(x + i);
        if (delta) {
            v = E::round(v + E::get(delta + i));
            E::put(x + i, v);
        }
        tail = tail + v * v;
    }
    float sum = lane_sum(acc) + tail;
#ifdef EAGLE_TRT_MUTATE_NORM
    // Test-only (tests/test_native_mutation.py): the last row of a many-row call sums its squares in another order.
    if (mutate) {
        sum = 0.0f;
        for (int j = n - 1; j >= 0; --j) sum += E::get(x + j) * E::get(x + j);
    }
#endif
    const float r = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
    for (i = 0; i + kLanes <= n; i += kLanes) E::store(h + i, E::load(w + i) * E::round(E::load(x + i) * r));
    for (; i < n; ++i) E::put(h + i, E::get(w + i) * E::round(E::get(x + i) * r));
}

// RoPE of one head vector (D elements) into dst: x * cos + rotate_half(x) * sin, each product and the sum rounded
// as torch's operators of that dtype round.
template <typename T>
void rope_head(const T* x, const T* cos, const T* sin, int D, T* dst) {
    using E = Elem<T>;
    const int half = D / 2;
    for (int j = 0; j < D; ++j) {
        const float rot = j < half ? -E::get(x + j + half) : E::get(x + j - half);
        E::put(dst + j, E::round(E::get(x + j) * E::get(cos + j)) + E::round(rot * E::get(sin + j)));
    }
}

// silu(g) * u per element: silu rounded to the dtype, then the product (torch's two operators).
// silu(g) = g * e / (1 + e) with e = exp(g) for g < 0, and g / (1 + exp(-g)) otherwise: exp only of values <= 0.
inline vf vsilu(vf g) {
    const vf neg = g < 0 ? g : -g;
    const vf e = vexp(neg);
    return (g < 0 ? g * e : g) / (e + 1.0f);
}

template <typename T>
void add_rms_norm(T* x, const T* delta, const T* w, T* h, int64_t T_, int64_t n, float eps, int threads) {
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (threads > 1 && T_ >= kParallelRows) schedule(static)
    for (int64_t t = 0; t < T_; ++t)
        add_norm_row(x + t * n, delta ? delta + t * n : nullptr, w, h + t * n, static_cast<int>(n), eps,
                     T_ > 1 && t == T_ - 1);
}

template <typename T>
void rope_qkv(const T* qkv, const T* bias, const T* cos, const T* sin, T* q_out, T* k_cache, int64_t k_sh,
              int64_t k_sr, T* v_cache, int64_t v_sh, int64_t v_sr, int64_t start, int64_t T_, int64_t H, int64_t Hkv,
              int64_t D, int threads) {
    using E = Elem<T>;
    const int64_t width = (H + 2 * Hkv) * D;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (threads > 1 && T_ >= kParallelRows) schedule(static)
    for (int64_t t = 0; t < T_; ++t) {
        T row[kMaxBiasedRow];
        const T* src = qkv + t * width;
        if (bias) {
            for (int64_t i = 0; i < width; ++i) E::put(row + i, E::get(src + i) + E::get(bias + i));
            src = row;
        }
        const T* c = cos + t * D;
        const T* s = sin + t * D;
        for (int64_t hq = 0; hq < H; ++hq) rope_head(src + hq * D, c, s, D, q_out + (hq * T_ + t) * D);
        for (int64_t hk = 0; hk < Hkv; ++hk) {
            rope_head(src + (H + hk) * D, c, s, D, k_cache + hk * k_sh + (start + t) * k_sr);
            std::memcpy(v_cache + hk * v_sh + (start + t) * v_sr, src + (H + Hkv + hk) * D, D * sizeof(T));
        }
    }
}

template <typename T>
void silu_mul(const T* gu, T* out, int64_t T_, int64_t I, int threads) {
    using E = Elem<T>;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (threads > 1 && T_ >= kParallelRows) schedule(static)
    for (int64_t t = 0; t < T_; ++t) {
        const T* g = gu + t * 2 * I;
        const T* u = g + I;
        T* o = out + t * I;
        int64_t i = 0;
        for (; i + kLanes <= I; i += kLanes) E::store(o + i, E::round(vsilu(E::load(g + i))) * E::load(u + i));
        for (; i < I; ++i) {
            vf g1 = vf{} + E::get(g + i);
            E::put(o + i, E::round(vsilu(g1)[0]) * E::get(u + i));
        }
    }
}

// gelu_tanh(g) * u per element (Gemma 3's MLP): 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) in fp32, in the
// order torch's tanh-approximate GELU writes it, rounded to the dtype, then the product. Element-wise, so every row
// is a function of that row alone.
template <typename T>
void gelu_tanh_mul(const T* gu, T* out, int64_t T_, int64_t I, int threads) {
    using E = Elem<T>;
    const float beta = static_cast<float>(1.4142135623730951 * 1.1283791670955126 * 0.5), kappa = 0.044715f;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (threads > 1 && T_ >= kParallelRows) schedule(static)
    for (int64_t t = 0; t < T_; ++t) {
        const T* g = gu + t * 2 * I;
        const T* u = g + I;
        T* o = out + t * I;
        for (int64_t i = 0; i < I; ++i) {
            const float x = E::get(g + i);
            const float cube = x * x * x;
            const float inner = beta * (x + kappa * cube);
            const float gelu = 0.5f * x * (1.0f + std::tanh(inner));
            E::put(o + i, E::round(vf{} + gelu)[0] * E::get(u + i));
        }
    }
}

// RMSNorm of every head vector of every row, in place: rows of `heads` vectors of D at `row_stride` apart.
template <typename T>
void head_rms_norm(T* x, const T* w, int64_t T_, int64_t heads, int64_t D, int64_t row_stride, float eps,
                   int threads) {
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (threads > 1 && T_ >= kParallelRows) schedule(static)
    for (int64_t t = 0; t < T_; ++t)
        for (int64_t h = 0; h < heads; ++h) {
            T* v = x + t * row_stride + h * D;
            add_norm_row(v, static_cast<const T*>(nullptr), w, v, static_cast<int>(D), eps);
        }
}

template <typename T>
int64_t argmax_row(const T* row, int64_t n) {
    using E = Elem<T>;
    float best = E::get(row);
    bool nan = best != best;
    int64_t i = 0;
    if (n >= kLanes) {
        vf m = E::load(row);
        vi odd = m != m;
        for (i = kLanes; i + kLanes <= n; i += kLanes) {
            const vf v = E::load(row + i);
            m = v > m ? v : m;
            odd |= v != v;
        }
        for (int l = 0; l < kLanes; ++l) {
            best = m[l] > best ? m[l] : best;
            nan = nan || odd[l];
        }
    }
    for (; i < n; ++i) {
        const float v = E::get(row + i);
        best = v > best ? v : best;
        nan = nan || v != v;
    }
    int64_t at = 0;
    if (nan) {
        while (E::get(row + at) == E::get(row + at)) ++at;  // NaN: torch reports the first one
    } else {
        while (E::get(row + at) != best) ++at;
    }
    return at;
}

}  // namespace

extern "C" {

// x: [T, n], updated in place to x + delta (delta null: unchanged); h: [T, n] = RMSNorm(x) * w. All fp32, or all
// bf16 (bf16 = 1). Rows are independent: threads split rows, never a row.
int eagle_trt_add_rms_norm(void* x, const void* delta, const void* w, void* h, int64_t T, int64_t n, float eps,
                           int bf16, int threads) {
    if (n <= 0) return -2;
    if (bf16)
        add_rms_norm(static_cast<uint16_t*>(x), static_cast<const uint16_t*>(delta), static_cast<const uint16_t*>(w),
                     static_cast<uint16_t*>(h), T, n, eps, threads);
    else
        add_rms_norm(static_cast<float*>(x), static_cast<const float*>(delta), static_cast<const float*>(w),
                     static_cast<float*>(h), T, n, eps, threads);
    return 0;
}

// qkv: [T, (H + 2 Hkv) D] (q heads, then k, then v), plus bias [(H + 2 Hkv) D] or null; cos, sin: [T, D]; all fp32
// or all bf16. Writes q rotated to q_out [H, T, D]; k rotated and v as they are to the cache at rows start ..
// start+T-1 (k_cache / v_cache point at the layer's [Hkv, capacity, D] block; strides in elements per head, per
// row). Returns -2 for an odd head_dim or one above 1024, or a biased row wider than kMaxBiasedRow.
int eagle_trt_rope_qkv(const void* qkv, const void* bias, const void* cos, const void* sin, void* q_out,
                       void* k_cache, int64_t k_sh, int64_t k_sr, void* v_cache, int64_t v_sh, int64_t v_sr,
                       int64_t start, int64_t T, int64_t H, int64_t Hkv, int64_t D, int bf16, int threads) {
    if (D <= 0 || D % 2 || D > 1024 || (bias && (H + 2 * Hkv) * D > kMaxBiasedRow)) return -2;
    if (bf16)
        rope_qkv(static_cast<const uint16_t*>(qkv), static_cast<const uint16_t*>(bias),
                 static_cast<const uint16_t*>(cos), static_cast<const uint16_t*>(sin), static_cast<uint16_t*>(q_out),
                 static_cast<uint16_t*>(k_cache), k_sh, k_sr, static_cast<uint16_t*>(v_cache), v_sh, v_sr, start, T,
                 H, Hkv, D, threads);
    else
        rope_qkv(static_cast<const float*>(qkv), static_cast<const float*>(bias), static_cast<const float*>(cos),
                 static_cast<const float*>(sin), static_cast<float*>(q_out), static_cast<float*>(k_cache), k_sh, k_sr,
                 static_cast<float*>(v_cache), v_sh, v_sr, start, T, H, Hkv, D, threads);
    return 0;
}

// gu: [T, 2I] (gate columns, then up); out: [T, I] = silu(gate) * up; fp32 or bf16.
int eagle_trt_silu_mul(const void* gu, void* out, int64_t T, int64_t I, int bf16, int threads) {
    if (bf16)
        silu_mul(static_cast<const uint16_t*>(gu), static_cast<uint16_t*>(out), T, I, threads);
    else
        silu_mul(static_cast<const float*>(gu), static_cast<float*>(out), T, I, threads);
    return 0;
}

// gu: [T, 2I] (gate columns, then up); out: [T, I] = gelu_tanh(gate) * up; fp32 or bf16.
int eagle_trt_gelu_tanh_mul(const void* gu, void* out, int64_t T, int64_t I, int bf16, int threads) {
    if (bf16)
        gelu_tanh_mul(static_cast<const uint16_t*>(gu), static_cast<uint16_t*>(out), T, I, threads);
    else
        gelu_tanh_mul(static_cast<const float*>(gu), static_cast<float*>(out), T, I, threads);
    return 0;
}

// x: rows [T] of `heads` vectors of D elements at row_stride elements apart (a qkv row's q or k heads), each
// replaced by its RMSNorm times w [D] (in place; the norm of add_rms_norm). fp32 or bf16.
int eagle_trt_head_rms_norm(void* x, const void* w, int64_t T, int64_t heads, int64_t D, int64_t row_stride, float eps,
                            int bf16, int threads) {
    if (D <= 0 || heads <= 0) return -2;
    if (bf16)
        head_rms_norm(static_cast<uint16_t*>(x), static_cast<const uint16_t*>(w), T, heads, D, row_stride, eps,
                      threads);
    else
        head_rms_norm(static_cast<float*>(x), static_cast<const float*>(w), T, heads, D, row_stride, eps, threads);
    return 0;
}

// x: [T, n], fp32 or bf16 -> out[t] = index of the largest value of row t, the first one on ties; NaN counts as the
// largest (as torch.argmax). Lane-wise maxima over the row, then the first index holding the maximum.
int eagle_trt_argmax(const void* x, int64_t T, int64_t n, int bf16, int64_t* out) {
    if (n <= 0) return -2;
    for (int64_t t = 0; t < T; ++t)
        out[t] = bf16 ? argmax_row(static_cast<const uint16_t*>(x) + t * n, n)
                      : argmax_row(static_cast<const float*>(x) + t * n, n);
    return 0;
}

}  // extern "C"
