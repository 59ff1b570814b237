// Every C entry point of the kernel library, in one place. Each .cpp includes this header, so the compiler checks
// every definition against its declaration here (an extern "C" function cannot be overloaded), and the Python side
// reads its ctypes argument types from this file (eagle_trt/models/native/bindings.py): one table for both.
//
// Conventions: returns 0 on success, -1 when working memory ran out, -2 for a shape the kernel does not take, -3
// when this build lacks the kernel (AMX). `bf16` selects the activations' dtype: 0 fp32, 1 bfloat16 (uint16 bits).
// `kernel` selects the projections' weights in a one-call forward: 0 packed for eagle_trt_gemm, 1 for AMX tiles, 2
// block weights (eagle_trt_blocks_gemm). `threads` is the OpenMP team size. Pointers to tensors are void*; strides are in elements.
#pragma once

#include <cstdint>

extern "C" {

// What this build runs: 3 AMX (tiles granted to the process), 2 AVX-512, 1 AVX2 + FMA, 0 none of them.
int eagle_trt_isa(void);
// Lanes of one fp32 vector in this build (16 with AVX-512, else 8): the projections' packed layout depends on it.
int eagle_trt_lanes(void);

// Row-invariant projections (gemm_simd.cpp): out [M, N] = x [M, K] @ W for fp32 or bf16 weights, in fp32.
int64_t eagle_trt_gemm_packed_size(int64_t K, int64_t N, int bf16);
int eagle_trt_gemm_pack(const void* w, void* packed, int64_t K, int64_t N, int bf16);
int eagle_trt_gemm(const void* x, const void* packed, void* out, int64_t M, int64_t K, int64_t N, int bf16,
                   int threads);

// Projections over GGUF block weights (gemm_blocks.cpp): a self-describing weight buffer (formats: ggml type ids).
int64_t eagle_trt_blocks_row_bytes(int64_t format, int64_t K);
int eagle_trt_blocks_dequant(const uint8_t* w, float* out, int64_t K, int64_t N);
int eagle_trt_blocks_gemm(const void* x, const uint8_t* w, void* out, int64_t M, int64_t K, int64_t N, int bf16,
                          int threads);

// The int8-activation layout of block weights (int8_pack.cpp; eagle_trt_blocks_gemm takes its buffers too).
int64_t eagle_trt_int8_group_bytes(int64_t format, int64_t K);
int eagle_trt_int8_repack(int64_t format, const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst);
int eagle_trt_int8_quantize(const float* x, int64_t M, int64_t K, int64_t block, int8_t* a, float* d);
int eagle_trt_int8_dot(void);
// Many-row calls on AMX-INT8 tiles (gemm_int8_amx.cpp): whether they run here, and from how many rows.
int eagle_trt_int8_amx(void);
int64_t eagle_trt_int8_set_amx_rows(int64_t rows);
// The vector path's software prefetch distance in bytes (0: none); returns the previous one, bytes < 0 only reads.
int64_t eagle_trt_int8_set_prefetch(int64_t bytes);

// The multiply-add peak of this build's instructions (madd_peak.cpp): G multiply-adds/s over `threads` threads of
// kind 0 fp32 fma, 1 bf16 dot (-1 without AVX512-BF16), 2 int8 dot; the best of `reps` timings per thread.
float eagle_trt_madd_peak(int kind, int threads, int reps);

// bf16 projections on AMX tiles (gemm_amx.cpp).
int eagle_trt_amx_available(void);
int eagle_trt_amx_pack(const uint16_t* w, uint16_t* packed, int64_t K, int64_t N);
int eagle_trt_amx_gemm(const uint16_t* x, const uint16_t* packed, uint16_t* out, int64_t M, int64_t K, int64_t N,
                       int threads);
int eagle_trt_amx_gemm_argmax(const uint16_t* x, const uint16_t* packed, int64_t* out, int64_t M, int64_t K, int64_t N,
                              int threads);

// Row ops (row_ops.cpp).
int eagle_trt_add_rms_norm(void* x, const void* delta, const void* w, void* h, int64_t T, int64_t n, float eps,
                           int bf16, int threads);
int eagle_trt_rope_qkv(const void* qkv, const void* bias, const void* cos, const void* sin, void* q_out,
                       void* k_cache, int64_t k_sh, int64_t k_sr, void* v_cache, int64_t v_sh, int64_t v_sr,
                       int64_t start, int64_t T, int64_t H, int64_t Hkv, int64_t D, int bf16, int threads);
int eagle_trt_silu_mul(const void* gu, void* out, int64_t T, int64_t I, int bf16, int threads);
int eagle_trt_gelu_tanh_mul(const void* gu, void* out, int64_t T, int64_t I, int bf16, int threads);
int eagle_trt_head_rms_norm(void* x, const void* w, int64_t T, int64_t heads, int64_t D, int64_t row_stride, float eps,
                            int bf16, int threads);
int eagle_trt_argmax(const void* x, int64_t T, int64_t n, int bf16, int64_t* out);

// Attention (tree_attention.cpp).
int eagle_trt_tree_attention(const void* q, int64_t q_sh, int64_t q_sr, const void* k, int64_t k_sh, int64_t k_sr,
                             const void* v, int64_t v_sh, int64_t v_sr, const uint8_t* mask, void* out, int H,
                             int Hkv, int T, int S, int D, float scale, int bf16, int threads);

// The target's decoder stack in one call, over one or several requests' rows (decoder_stack.cpp).
int64_t eagle_trt_stack_scratch(int64_t T, int64_t hidden, int64_t H, int64_t Hkv, int64_t D, int64_t I);
int eagle_trt_decoder_stack(void* x, const void* const* weights, int64_t L, const void* final_norm, void* h_out,
                            const void* cos, const void* sin, const void* cos_local, const void* sin_local,
                            const uint8_t* local_layers, int64_t n_parts, const int64_t* parts, void* const* caches,
                            const uint8_t* const* masks, const uint8_t* const* local_masks, int64_t T, int64_t hidden,
                            int64_t H, int64_t Hkv, int64_t D, int64_t I, float eps, float scale, int act,
                            const int64_t* aux_layers, int64_t n_aux, void* aux_out, void* scratch, int bf16, int kernel,
                            int threads);

// The draft head's forward in one call, and drafting's top-k log-probs (draft_layer.cpp).
int64_t eagle_trt_draft_scratch(int64_t T, int64_t hidden, int64_t H, int64_t Hkv, int64_t D, int64_t I);
int eagle_trt_draft_layer(const void* const* w, const void* hidden, const void* e, int prenorm, const void* cos,
                          const void* sin, int64_t n_parts, const int64_t* parts, void* const* caches,
                          const uint8_t* const* masks, int64_t T, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                          int64_t I, int64_t vocab, float eps, int last_only, void* out, void* logits, void* scratch,
                          int bf16, int kernel, int threads);
int eagle_trt_top_logp(const void* logits, int64_t rows, int64_t V, int k, float* vals, int64_t* idx, int bf16);
}
