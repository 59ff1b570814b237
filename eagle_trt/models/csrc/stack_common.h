// What the two one-call forwards (decoder_stack.cpp, draft_layer.cpp) share: the projection kernel an engine chose,
// as one function pointer, and the attention scale.
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

// The kernel for these activations (bf16 or fp32) and weights (packed for AMX tiles or for eagle_trt_gemm); null
// for AMX with fp32.
inline Projection projection(int bf16, int amx) {
    if (amx) return bf16 ? project_amx : nullptr;
    return bf16 ? project_bf16 : project_f32;
}

// 1 / sqrt(head_dim), as native/attention.py passes it.
inline float attention_scale(int64_t D) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))); }

}  // namespace eagle_trt
