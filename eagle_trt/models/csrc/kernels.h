// The library's C entry points that other kernels of it call (decoder_stack.cpp, draft_layer.cpp): defined in
// row_ops.cpp, gemm_amx.cpp and tree_attention.cpp, documented there.
#pragma once

#include <cstdint>

extern "C" {
int eagle_trt_add_rms_norm(uint16_t* x, const uint16_t* delta, const uint16_t* w, uint16_t* h, int64_t T, int64_t n,
                           float eps, int threads);
int eagle_trt_rope_qkv(const uint16_t* qkv, const uint16_t* bias, const uint16_t* cos, const uint16_t* sin,
                       uint16_t* q_out, uint16_t* k_cache, int64_t k_sh, int64_t k_sr, uint16_t* v_cache, int64_t v_sh,
                       int64_t v_sr, int64_t start, int64_t T, int64_t H, int64_t Hkv, int64_t D, int threads);
int eagle_trt_silu_mul(const uint16_t* gu, uint16_t* out, int64_t T, int64_t I, int threads);
int eagle_trt_amx_gemm(const uint16_t* x, const uint16_t* packed, uint16_t* out, int64_t M, int64_t K, int64_t N,
                       int threads);
int eagle_trt_tree_attention(const void* q, int64_t q_sh, int64_t q_sr, const void* k, int64_t k_sh, int64_t k_sr,
                             const void* v, int64_t v_sh, int64_t v_sr, const uint8_t* mask, void* out, int H,
                             int Hkv, int T, int S, int D, float scale, int bf16, int threads);
}
