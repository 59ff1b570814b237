// What the two one-call forwards (decoder_stack.cpp, draft_layer.cpp) share: the projection kernel an engine chose,
// as one function pointer, a batched pass's parts, and the attention scale.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace eagle_trt {

// out [M, N] = x [M, K] @ packed weight, in the activations' dtype.
using Projection = int (*)(const void* x, const void* w, void* out, int64_t M, int64_t K, int64_t N, int threads);

inline int project_f32(const void* x, const void* w, void* out, int64_t M, int64_t K, int64_t N, int threads) {
    return eagle_trt_gemm(x, w, out, M, K, N, 0, threads);
}

inline int project_bf16(const void* x, const void* w, void* out, int64_t M, int64_t K, int64_t N, int threads) {
    return eagle_trt_gemm(x, w, out, M, K, N, 1, threads);
}

inline int project_amx(const void* x, const void* w, void* out, int64_t M, int64_t K, int64_t N, int threads) {
    return eagle_trt_amx_gemm(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(w),
                              static_cast<uint16_t*>(out), M, K, N, threads);
}

inline int project_blocks_f32(const void* x, const void* w, void* out, int64_t M, int64_t K, int64_t N, int threads) {
    return eagle_trt_blocks_gemm(x, static_cast<const uint8_t*>(w), out, M, K, N, 0, threads);
}

inline int project_blocks_bf16(const void* x, const void* w, void* out, int64_t M, int64_t K, int64_t N,
                               int threads) {
    return eagle_trt_blocks_gemm(x, static_cast<const uint8_t*>(w), out, M, K, N, 1, threads);
}

// The kernel for these activations (bf16 or fp32) and weights (kernel: 0 packed for eagle_trt_gemm, 1 for AMX
// tiles, 2 block weights for eagle_trt_blocks_gemm); null for AMX with fp32 or an unknown kernel.
inline Projection projection(int bf16, int kernel) {
    if (kernel == 2) return bf16 ? project_blocks_bf16 : project_blocks_f32;
    if (kernel == 1) return bf16 ? project_amx : nullptr;
    if (kernel != 0) return nullptr;
    return bf16 ? project_bf16 : project_f32;
}

// One request's rows in a batched forward: `rows` consecutive rows after the previous part's, attending to the
// request's own KV cache (k, v: one layer's [Hkv, capacity, D] at layer_stride apart, with these head and row strides)
// from slot `start` on, through its own mask ([rows, start + rows] bytes, or null for one row); a sliding-window
// layer's rows through local_mask instead (the same mask less the keys outside the window).
template <typename T>
struct Part {
    int64_t row0, rows, start, layer_stride, head_stride, row_stride;
    T *k, *v;
    const uint8_t* mask;
    const uint8_t* local_mask;
};

// The callers' part table -> Parts: `width` int64s a part (rows, start, then the caches' strides: layer, head and row
// with width 5; head and row with width 4, one layer), its K and V cache pointers, its mask and its sliding-window
// mask (where local_masks or its entry is null, the part's mask: its window hides none of its keys). -2 unless the
// parts' rows tile [0, total) exactly.
template <typename T>
int read_parts(const int64_t* table, int width, void* const* caches, const uint8_t* const* masks, int64_t n_parts,
               int64_t total, Part<T>* out, const uint8_t* const* local_masks = nullptr) {
    int64_t row = 0;
    for (int64_t p = 0; p < n_parts; ++p) {
        const int64_t* r = table + p * width;
        if (r[0] <= 0 || r[1] < 0) return -2;
        const int64_t layer = width == 5 ? r[2] : 0;
        out[p] = Part<T>{row, r[0], r[1], layer, r[width - 2], r[width - 1], static_cast<T*>(caches[2 * p]),
                         static_cast<T*>(caches[2 * p + 1]), masks[p],
                         local_masks && local_masks[p] ? local_masks[p] : masks[p]};
        row += r[0];
    }
    return row == total ? 0 : -2;
}

// 1 / sqrt(head_dim), as native/ops.py passes it (the draft layer's; a target's stack takes its model's scale).
inline float attention_scale(int64_t D) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))); }

}  // namespace eagle_trt
