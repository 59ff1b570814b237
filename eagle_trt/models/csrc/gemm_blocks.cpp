// Projections y = x @ W^T for weights kept in GGUF's quantized blocks (blocks.h), with every output row a function
// of that row of x alone.
//
// The weight is one self-describing buffer (models/native/block_gemm.py writes it): a header of int64 words (magic,
// K, N, the segment count, then per segment its format, rows, bytes per row and byte offset) and the segments'
// rows, each row the GGUF blocks of one output's K weights. A fused projection (q, k and v; gate and up) whose parts
// a GGUF stores in different formats is several segments, one output row range each.
//
// The invariant: y[m, n] = reduce(chains), where row n of W is de-quantized into fp32 exactly (blocks.h) and then
//   acc[l] = 0;  for k = l, l + 32, l + 64, ... < K:  acc[l] = fma(w[n, k], x[m, k], acc[l])     (l = 0 .. 31)
//   y[m, n] = the 32 lanes summed by a fixed pairwise tree (lane l + lane l + 16, then + 8, + 4, + 2, + 1)
// rounded once for a bf16 output. The 32 lanes are two AVX-512 vectors or four AVX2 ones: the same chains and the
// same tree on both, so the two builds give the same bits. Rows take turns on a de-quantized weight row (register
// blocks of rows), threads split the output rows (never a sum), so neither the row count, nor the rows beside a
// row, nor the thread count changes a bit: a T-row verify pass gives the bits of T one-row calls.

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "blocks.h"
#include "int8_blocks.h"
#include "kernels.h"
#include "simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using namespace eagle_trt;

constexpr int64_t kMagic = 0x314b4c4250525445;  // "ETRPBLK1", little-endian
constexpr int64_t kMaxSegments = 4;
constexpr int64_t kHeaderWords = 8 + 4 * kMaxSegments;
constexpr int kWidth = 32;                 // logical lanes of one chain set (k mod 32)
constexpr int kVecs = kWidth / kLanes;     // vectors holding them: 2 with AVX-512, 4 with AVX2
#if defined(__AVX512F__)
constexpr int kRows = 8;                   // 16 accumulators, 2 weight vectors and a broadcast-free x load
#else
constexpr int kRows = 3;                   // 12 accumulators, 4 weight vectors of 16 registers
#endif

struct Segment {
    int64_t format, rows, row_bytes, offset;
};

struct Weight {
    int64_t K, N, n;
    Segment seg[kMaxSegments];
};

// The header of a block weight, checked against the call's K and N: 0, or -2.
int read_weight(const uint8_t* w, int64_t K, int64_t N, Weight& out) {
    int64_t h[kHeaderWords];
    std::memcpy(h, w, sizeof h);
    if (h[0] != kMagic || h[1] != K || h[2] != N || h[3] < 1 || h[3] > kMaxSegments) return -2;
    out.K = K, out.N = N, out.n = h[3];
    int64_t rows = 0;
    for (int64_t s = 0; s < out.n; ++s) {
        const int64_t* e = h + 8 + 4 * s;
        out.seg[s] = Segment{e[0], e[1], e[2], e[3]};
        if (e[1] <= 0 || block_row_bytes(e[0], K) != e[2] || e[3] < kHeaderWords * 8) return -2;
        rows += e[1];
    }
    return rows == N ? 0 : -2;
}

// Row n of the weight, de-quantized into y[0 .. K), zeros to the next multiple of 32.
void weight_row(const uint8_t* w, const Weight& wt, int64_t n, float* y) {
    int64_t s = 0;
    while (n >= wt.seg[s].rows) n -= wt.seg[s++].rows;
    const Segment& g = wt.seg[s];
    dequant_row(g.format, w + g.offset + n * g.row_bytes, wt.K, y);
    for (int64_t k = wt.K; k % kWidth; ++k) y[k] = 0.0f;
}

// The 32 lanes of a chain set summed by the fixed tree: (l, l + 16), then (l, l + 8) and lane_sum's tree over 8.
inline float reduce(const vf (&a)[kVecs]) {
    float t[kWidth];
    for (int v = 0; v < kVecs; ++v) vstore(t + v * kLanes, a[v]);
    for (int width = kWidth / 2; width > 0; width /= 2)
        for (int l = 0; l < width; ++l) t[l] = t[l] + t[l + width];
    return t[0];
}

#ifdef EAGLE_TRT_MUTATE_GEMM
// Test-only (tests/test_native_mutation.py): the 32 lanes summed in lane order instead of the tree.
inline float reduce_in_order(const vf (&a)[kVecs]) {
    float t[kWidth];
    for (int v = 0; v < kVecs; ++v) vstore(t + v * kLanes, a[v]);
    float s = 0.0f;
    for (int l = 0; l < kWidth; ++l) s = s + t[l];
    return s;
}
#endif

// R rows of x (fp32, row stride ldx, padded to Kp) against one de-quantized weight row: out[r] = y[r, n].
template <int R>
inline void rows_dot(const float* x, int64_t ldx, const float* w, int64_t Kp, float* out, bool perturb_last) {
    vf a[R][kVecs];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < kVecs; ++v) a[r][v] = vf{};
    for (int64_t k = 0; k < Kp; k += kWidth) {
        vf wv[kVecs];
        for (int v = 0; v < kVecs; ++v) wv[v] = vload(w + k + v * kLanes);
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < kVecs; ++v) a[r][v] = vfma(wv[v], vload(x + r * ldx + k + v * kLanes), a[r][v]);
    }
    for (int r = 0; r < R; ++r) out[r] = reduce(a[r]);
#ifdef EAGLE_TRT_MUTATE_GEMM
    if (perturb_last) out[R - 1] = reduce_in_order(a[R - 1]);
#else
    (void)perturb_last;
#endif
}

// rows_dot for two weight rows at once (w0, w1; out0[r], out1[r]): each x load serves both, so a many-row call
// streams x half as often. Each output keeps its own chains, the same as rows_dot's.
template <int R>
inline void rows_dot2(const float* x, int64_t ldx, const float* w0, const float* w1, int64_t Kp, float* out0,
                      float* out1, bool perturb_last) {
    vf a[R][2][kVecs];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < kVecs; ++v) a[r][0][v] = a[r][1][v] = vf{};
    for (int64_t k = 0; k < Kp; k += kWidth) {
        vf wa[kVecs], wb[kVecs];
        for (int v = 0; v < kVecs; ++v) wa[v] = vload(w0 + k + v * kLanes), wb[v] = vload(w1 + k + v * kLanes);
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < kVecs; ++v) {
                const vf xv = vload(x + r * ldx + k + v * kLanes);
                a[r][0][v] = vfma(wa[v], xv, a[r][0][v]);
                a[r][1][v] = vfma(wb[v], xv, a[r][1][v]);
            }
    }
    for (int r = 0; r < R; ++r) out0[r] = reduce(a[r][0]), out1[r] = reduce(a[r][1]);
#ifdef EAGLE_TRT_MUTATE_GEMM
    if (perturb_last) out0[R - 1] = reduce_in_order(a[R - 1][0]), out1[R - 1] = reduce_in_order(a[R - 1][1]);
#else
    (void)perturb_last;
#endif
}

// One row of x against one weight row de-quantized in registers instead of into a buffer (a decode step's call):
// the same weights, lane l's chain over the same k in the same order, the same tree, so the same bits as rows_dot.
inline void fma32(const v16f& w0, const v16f& w1, const float* x, vf (&a)[kVecs]) {
    vf w[kVecs];
    std::memcpy(w, &w0, sizeof w0);
    std::memcpy(reinterpret_cast<char*>(w) + sizeof w0, &w1, sizeof w1);
    for (int v = 0; v < kVecs; ++v) a[v] = vfma(w[v], vload(x + v * kLanes), a[v]);
}

// y[0, n] for formats with a register path (q8_0, q4_0, q4_1, q4_K); false for the others (they take the buffer).
inline bool fused_row_dot(int64_t format, const uint8_t* row, const float* x, int64_t K, float& y) {
    vf a[kVecs];
    for (int v = 0; v < kVecs; ++v) a[v] = vf{};
    if (format == kQ8_0) {
        for (int64_t k = 0; k < K; k += 32, row += 34) {
            const float d = half_to_float(row);
            fma32(int8_to_f32(row + 2) * d, int8_to_f32(row + 18) * d, x + k, a);
        }
    } else if (format == kQ4_0) {
        for (int64_t k = 0; k < K; k += 32, row += 18) {
            const float d = half_to_float(row);
            const v16u8 qs = load16(row + 2);
            const v16i32 lo = __builtin_convertvector(qs & 0x0F, v16i32) - 8;
            const v16i32 hi = __builtin_convertvector(qs >> 4, v16i32) - 8;
            fma32(__builtin_convertvector(lo, v16f) * d, __builtin_convertvector(hi, v16f) * d, x + k, a);
        }
    } else if (format == kQ4_1) {
        for (int64_t k = 0; k < K; k += 32, row += 20) {
            const float d = half_to_float(row), m = half_to_float(row + 2);
            const v16u8 qs = load16(row + 4);
            fma32(to_f32(qs & 0x0F) * d + m, to_f32(qs >> 4) * d + m, x + k, a);
        }
    } else if (format == kQ4_K) {
        for (int64_t k = 0; k < K; k += 256, row += 144) {
            const float d = half_to_float(row), dmin = half_to_float(row + 2);
            const uint8_t* qs = row + 16;
            for (int j = 0, is = 0; j < 256; j += 64, is += 2, qs += 32) {
                int sc, m;
                scale_min_k4(is, row + 4, sc, m);
                const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
                scale_min_k4(is + 1, row + 4, sc, m);
                const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
                const v16u8 q0 = load16(qs), q1 = load16(qs + 16);
                fma32(d1 * to_f32(q0 & 0x0F) - m1, d1 * to_f32(q1 & 0x0F) - m1, x + k + j, a);
                fma32(d2 * to_f32(q0 >> 4) - m2, d2 * to_f32(q1 >> 4) - m2, x + k + j + 32, a);
            }
        }
    } else {
        return false;
    }
    y = reduce(a);
    return true;
}

using DotFn = void (*)(const float*, int64_t, const float*, int64_t, float*, bool);

template <size_t... I>
constexpr std::array<DotFn, sizeof...(I)> dot_table(std::index_sequence<I...>) {
    return {&rows_dot<static_cast<int>(I) + 1>...};
}

#if defined(__AVX512F__)
constexpr int kRows2 = 4;  // 16 accumulators and 4 weight vectors for two weight rows
#else
constexpr int kRows2 = 0;  // AVX2's 16 registers hold one weight row's blocks only
#endif
using Dot2Fn = void (*)(const float*, int64_t, const float*, const float*, int64_t, float*, float*, bool);

template <size_t... I>
constexpr std::array<Dot2Fn, sizeof...(I)> dot2_table(std::index_sequence<I...>) {
    return {&rows_dot2<static_cast<int>(I) + 1>...};
}

// Output rows n and n + 1 for every row of x (M > 1): both weight rows de-quantized, then register blocks of rows.
template <typename T>
void two_outputs(const uint8_t* w, const Weight& wt, int64_t n, const float* xf, int64_t M, int64_t Kp, float* wrow,
                 T* out) {
    if constexpr (kRows2 > 0) {
        static constexpr auto table2 = dot2_table(std::make_index_sequence<kRows2>{});
        weight_row(w, wt, n, wrow);
        weight_row(w, wt, n + 1, wrow + Kp);
        const int64_t blocks = (M + kRows2 - 1) / kRows2, base = M / blocks, extra = M % blocks;
        float y0[kRows2], y1[kRows2];
        for (int64_t b = 0, r0 = 0; b < blocks; ++b) {
            const int64_t rows = base + (b < extra);
            table2[rows - 1](xf + r0 * Kp, Kp, wrow, wrow + Kp, Kp, y0, y1, r0 + rows == M);
            for (int64_t r = 0; r < rows; ++r) {
                Elem<T>::put(out + (r0 + r) * wt.N + n, y0[r]);
                Elem<T>::put(out + (r0 + r) * wt.N + n + 1, y1[r]);
            }
            r0 += rows;
        }
    }
}

template <typename T>
int blocks_gemm(const T* x, const uint8_t* w, T* out, int64_t M, int64_t K, int64_t N, int threads) {
    static constexpr auto table = dot_table(std::make_index_sequence<kRows>{});
    Weight wt;
    if (read_weight(w, K, N, wt)) return -2;
    const int64_t Kp = (K + kWidth - 1) / kWidth * kWidth;
    // The rows as fp32, zero-padded to Kp: read by every thread, written once here.
    static thread_local Buffer b_x;
    float* xf = b_x.get(static_cast<size_t>(M * Kp));
    if (!xf) return -1;
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t k = 0; k < K; ++k) xf[m * Kp + k] = Elem<T>::get(x + m * K + k);
        for (int64_t k = K; k < Kp; ++k) xf[m * Kp + k] = 0.0f;
    }
    const int nthreads = threads > 0 ? threads : 1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && N > 1)
    {
        static thread_local Buffer b_w;
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int tid = 0, nt = 1;
#endif
        const int64_t per = (N + nt - 1) / nt, n0 = tid * per, n1 = n0 + per < N ? n0 + per : N;
        float* wrow = b_w.get(static_cast<size_t>(2 * Kp));
        if (!wrow) {
#pragma omp atomic write
            failed = 1;
        } else {
            float y[kRows];
            for (int64_t n = n0; n < n1; ++n) {
                if (M == 1 && wt.K % kWidth == 0) {
                    int64_t s = 0, r = n;
                    while (r >= wt.seg[s].rows) r -= wt.seg[s++].rows;
                    const Segment& g = wt.seg[s];
                    if (fused_row_dot(g.format, w + g.offset + r * g.row_bytes, xf, wt.K, y[0])) {
                        Elem<T>::put(out + n, y[0]);
                        continue;
                    }
                }
                if (kRows2 > 0 && M > 1 && n + 1 < n1) {
                    two_outputs(w, wt, n, xf, M, Kp, wrow, out);
                    ++n;
                    continue;
                }
                weight_row(w, wt, n, wrow);
                const int64_t blocks = (M + kRows - 1) / kRows, base = M / blocks, extra = M % blocks;
                for (int64_t b = 0, r0 = 0; b < blocks; ++b) {
                    const int64_t rows = base + (b < extra);
                    const bool last = M > 1 && r0 + rows == M;
                    table[rows - 1](xf + r0 * Kp, Kp, wrow, Kp, y, last);
                    for (int64_t r = 0; r < rows; ++r) Elem<T>::put(out + (r0 + r) * N + n, y[r]);
                    r0 += rows;
                }
            }
        }
    }
    return failed ? -1 : 0;
}

}  // namespace

extern "C" {

// Bytes of one row of K weights in a ggml format, or -2 when K is not a whole number of its blocks or the format is
// not one these kernels take.
int64_t eagle_trt_blocks_row_bytes(int64_t format, int64_t K) {
    const int64_t b = block_row_bytes(format, K);
    return b < 0 ? -2 : b;
}

// Every row of a block weight de-quantized: out [N, K] fp32.
int eagle_trt_blocks_dequant(const uint8_t* w, float* out, int64_t K, int64_t N) {
    Weight wt;
    if (read_weight(w, K, N, wt)) return -2;
    std::vector<float> row(static_cast<size_t>((K + kWidth - 1) / kWidth * kWidth));
    for (int64_t n = 0; n < N; ++n) {
        weight_row(w, wt, n, row.data());
        std::memcpy(out + n * K, row.data(), K * sizeof(float));
    }
    return 0;
}

// out [M, N] = x [M, K] @ W^T for a block weight (its header gives K and N, checked); x and out fp32, or both bf16.
int eagle_trt_blocks_gemm(const void* x, const uint8_t* w, void* out, int64_t M, int64_t K, int64_t N, int bf16,
                          int threads) {
    if (M <= 0 || K <= 0 || N <= 0) return -2;
    int64_t magic;
    std::memcpy(&magic, w, sizeof magic);
    if (magic == kInt8Magic) return int8_blocks_gemm(x, w, out, M, K, N, bf16, threads);
    if (bf16)
        return blocks_gemm(static_cast<const uint16_t*>(x), w, static_cast<uint16_t*>(out), M, K, N, threads);
    return blocks_gemm(static_cast<const float*>(x), w, static_cast<float*>(out), M, K, N, threads);
}

}  // extern "C"
