// Block projections with int8 activations (gemm_int8.cpp; the weight repacked by int8_pack.cpp): the formula, the
// repacked layout, the activation rows and the 16-lane integer helpers both files share.
//
// The formats (GGUF, ggml-common.h; the same facts as quant_blocks.py):
//   q8_0: 32 weights, w = d * q, q int8.
//   q4_0: 32 weights, w = d * (q - 8), q 4-bit; byte i of a block holds k = i (low nibble) and k = i + 16 (high).
//   q4_1: 32 weights, w = d * q + m, q 4-bit, nibbles as q4_0's.
//   q5_0: 32 weights, w = d * (q - 16), q 5-bit: q4_0's nibbles and a little-endian uint32 whose bit k is k's 5th.
//   q4_k: 256 weights in 8 sub-blocks s of 32, 6-bit scale sc_s and minimum m_s: w = (d * sc_s) * q - dmin * m_s.
//   q6_k: 256 weights in 16 sub-blocks s of 16, int8 scale sc_s: w = (d * sc_s) * (q - 32), q 6-bit.
// An activation row x is quantized row-locally, symmetric, per block of 32 (for q8_0, q4_0, q4_1, q5_0: "Q32") or of 256 (for
// q4_k, q6_k: "Q256", with the sums of its 16- and 32-element sub-blocks, as ggml's Q8_K keeps them):
//   amax = max |x| over the block; da = amax / 127; a = round_half_even(x * (127 / amax)) in [-127, 127];
//   amax == 0: da = 0 and a = 0.                                        S = sum of a over a (sub-)block.
// (ggml's Q8_K maps the signed maximum to -128 and stores 1/iscale; this one is symmetric, da in fp32, one rule for
// both block sizes.) Per weight block and output row, an exact int32 part and then one fixed fp32 step:
//   q8_0: I = sum q a                                  acc = fma(d * da, float(I), acc)
//   q4_0: I = sum q a - 8 S                            acc = fma(d * da, float(I), acc)
//   q4_1: I = sum q a                                  acc = fma(d * da, float(I), acc);
//                                                      acc = fma(m * da, float(S), acc)
//   q5_0: I = sum q a - 16 S                           acc = fma(d * da, float(I), acc)
//   q4_k: I = sum_s sc_s sum_s(q a), J = sum_s m_s S_s  acc = fma(d * da, float(I), acc);
//                                                      acc = fma(-(dmin * da), float(J), acc)
//   q6_k: I = sum_s sc_s (sum_s(q a) - 32 S_s)         acc = fma(d * da, float(I), acc)
// from acc = 0, the blocks in k order; y = acc (rounded once to bf16 for bf16 activations). Bounds: |I| <= 32 * 128
// * 127 (q8_0), 63 * 8 * 32 * 15 * 127 (q4_k), 16 * 128 * 16 * 32 * 127 (q6_k), all < 2^31; float(I) rounds to
// nearest where |I| > 2^24, the same conversion everywhere. Each output is its own lane: no sum crosses rows, so a
// T-row call gives the bits of T one-row calls, and every ISA computes each lane's same integers and fp32 steps.
//
// The repacked layout: output rows in groups of 16 (the last group padded with zero-scale rows); a group's blocks
// in k order. A "quad vector" is 64 bytes: 16 lanes of 4 bytes, lane r four consecutive k of the group's row r, so
// one 32-bit lane of an integer dot product is one output row times 4 k. Per block, per group (fp16 scales as GGUF
// stores them; u8 codes with the format's offset kept, removed through S):
//   q8_0 (544 B): d[16] | 8 quad vectors of q + 128, vector j = k 4j .. 4j+3.
//   q4_0 (288 B): d[16] | 4 quad vectors, vector j byte t: low nibble k = 4j + t, high nibble k = 16 + 4j + t.
//   q4_1 (320 B): d[16] | m[16] | q4_0's 4 quad vectors.
//   q5_0 (352 B): q4_0's | one quad vector of fifth bits: byte t, bit j: k = 4j + t; bit 4 + j: k = 16 + 4j + t.
//   q4_k (2368 B): d[16] | dmin[16] | sc[8][16] u8 | m[4][16][2] u8 (m_2p, m_2p+1 per row) | 4 chunks of 64 k, each
//                  8 quad vectors: vector j byte t: low nibble k = 64c + 4j + t, high nibble k = 64c + 32 + 4j + t.
//   q6_k (3360 B): d[16] | sc[16][16] int8 | 8 chunks of 32 k, each 4 quad vectors (vector j byte t: the low 4 bits
//                  of k = 32c + 4j + t and of k = 32c + 16 + 4j + t) then two quad vectors of high bits (bits 2j, 2j+1
//                  of byte t: the top 2 bits of k = 32c + 4j + t, then of k = 32c + 16 + 4j + t).
// The same bytes as GGUF's per weight, but q4_k (148 a row per 256 instead of 144: its scales unpacked).
#pragma once

#include <cstdint>
#include <cstring>

#include "blocks.h"

namespace eagle_trt {

constexpr int64_t kInt8Magic = 0x3138514250525445;  // "ETRPBQ81", little-endian
constexpr int kGroup = 16;                            // output rows per group: one 16-lane vector

// Bytes of one group's block of a format (0 for a format without an int8 path) and that block's weights.
inline int64_t int8_block_bytes(int64_t format) {
    switch (format) {
        case kQ8_0: return 544;
        case kQ4_0: return 288;
        case kQ4_1: return 320;
        case kQ5_0: return 352;
        case kQ4_K: return 2368;
        case kQ6_K: return 3360;
        default: return 0;
    }
}

inline int64_t int8_group_bytes(int64_t format, int64_t K) {
    const BlockShape s = block_shape(format);
    const int64_t b = int8_block_bytes(format);
    return b == 0 || K <= 0 || K % s.elems ? -1 : K / s.elems * b;
}

// One quantized activation row: a [K] int8; Q32: d [K/32], s [K/32] per-block sums; Q256: d [K/256], s16 [K/16]
// sub-block sums, sp [K/64] the 32-element sums in pairs (low 16 bits S_2p, high S_2p+1) for q4_k's minimum term.
struct QRow {
    const int8_t* a;
    const float* d;
    const int32_t* s;
    const int16_t* s16;
    const int32_t* sp;
};

// The quantizer of the header comment, for one row: `block` 32 or 256. d [K / block]; s32 [K/32] sums per 32;
// s16 [K/16] sums per 16 (null: not wanted).
void int8_quantize_row(const float* x, int64_t K, int block, int8_t* a, float* d, int32_t* s32, int16_t* s16);

// out [M, N] = x [M, K] @ W^T for an int8-layout weight (gemm_int8.cpp; eagle_trt_blocks_gemm hands it over).
int int8_blocks_gemm(const void* x, const uint8_t* w, void* out, int64_t M, int64_t K, int64_t N, int bf16, int threads);

// ---- 16 lanes ------------------------------------------------------------------------------------------------
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int8_t v16s8 __attribute__((vector_size(16)));
typedef uint8_t v32u8 __attribute__((vector_size(32)));
typedef int16_t v32i16 __attribute__((vector_size(64)));

// The 64 bytes at p as one 16-lane vector (any alignment).
template <typename V>
inline V load64(const void* p) {
    V v;
    std::memcpy(&v, p, 64);
    return v;
}

inline v16u load_quads(const uint8_t* p) { return load64<v16u>(p); }

inline int32_t load_quad(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

#if defined(__AVX2__)
// Two 8-lane halves as one 16-lane vector (lanes 0..7, then 8..15).
inline v16i join_halves(const __m256i& lo, const __m256i& hi) {
    v16i r;
    std::memcpy(&r, &lo, 32);
    std::memcpy(reinterpret_cast<char*>(&r) + 32, &hi, 32);
    return r;
}
#endif

// 16 bytes -> 16 int32 lanes, zero- or sign-extended (GCC's generic conversion of a byte vector is scalar code, so
// the vector builds say it with intrinsics).
template <bool Signed>
inline v16i byte_lanes(const uint8_t* p) {
#if defined(__AVX512F__)
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return reinterpret_cast<v16i>(Signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
#elif defined(__AVX2__)
    const __m128i b0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i b1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8));
    if constexpr (Signed) return join_halves(_mm256_cvtepi8_epi32(b0), _mm256_cvtepi8_epi32(b1));
    return join_halves(_mm256_cvtepu8_epi32(b0), _mm256_cvtepu8_epi32(b1));
#else
    if constexpr (Signed) {
        v16s8 v;
        std::memcpy(&v, p, 16);
        return __builtin_convertvector(v, v16i);
    }
    return __builtin_convertvector(load16(p), v16i);
#endif
}

inline v16i u8_lanes(const uint8_t* p) { return byte_lanes<false>(p); }
inline v16i s8_lanes(const uint8_t* p) { return byte_lanes<true>(p); }

// 16 rows' (m_2p, m_2p+1) byte pairs -> one lane of two int16 per row.
inline v16i u8_pairs(const uint8_t* p) {
#if defined(__AVX512BW__)
    return reinterpret_cast<v16i>(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__AVX2__)
    const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i hi = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    return join_halves(lo, hi);
#else
    v32u8 v;
    std::memcpy(&v, p, 32);
    const v32i16 w = __builtin_convertvector(v, v32i16);
    v16i r;
    std::memcpy(&r, &w, 64);
    return r;
#endif
}

// 16 fp16 -> fp32, exact.
inline v16f halves16(const uint8_t* p) {
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return reinterpret_cast<const v16f&>(f);
#elif defined(__F16C__)
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    v16f r;
    std::memcpy(&r, &lo, 32);
    std::memcpy(reinterpret_cast<char*>(&r) + 32, &hi, 32);
    return r;
#else
    v16f r;
    for (int l = 0; l < 16; ++l) r[l] = half_to_float(p + 2 * l);
    return r;
#endif
}

// fma(a, b, c) in every lane, one rounding.
inline v16f fma16(v16f a, v16f b, v16f c) {
#if defined(__AVX512F__)
    const __m512 r = _mm512_fmadd_ps(reinterpret_cast<const __m512&>(a), reinterpret_cast<const __m512&>(b),
                                     reinterpret_cast<const __m512&>(c));
    return reinterpret_cast<const v16f&>(r);
#elif defined(__FMA__)
    const __m256* pa = reinterpret_cast<const __m256*>(&a);
    const __m256* pb = reinterpret_cast<const __m256*>(&b);
    const __m256* pc = reinterpret_cast<const __m256*>(&c);
    const __m256 lo = _mm256_fmadd_ps(pa[0], pb[0], pc[0]), hi = _mm256_fmadd_ps(pa[1], pb[1], pc[1]);
    v16f r;
    std::memcpy(&r, &lo, 32);
    std::memcpy(reinterpret_cast<char*>(&r) + 32, &hi, 32);
    return r;
#else
    v16f r;
    for (int l = 0; l < 16; ++l) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return r;
#endif
}

inline v16f to_f32(v16i v) { return __builtin_convertvector(v, v16f); }

}  // namespace eagle_trt
