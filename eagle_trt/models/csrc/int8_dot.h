// The integer dot product of the int8 block projections (gemm_int8.cpp), per ISA: 16 lanes of int32, each adding
// sum over its 4 bytes t of u[t] (unsigned) * a[t] (signed, one 4-byte quad broadcast to every lane). All three give
// the exact integer, so the ISA never changes a bit of the result:
//   3: AVX512-VNNI, one zmm vpdpbusd (no saturation: it sums in int32).
//   2: AVX-VNNI, two ymm VEX vpdpbusd.
//   1: AVX2, two ymm vpmaddubsw + vpmaddwd: vpmaddubsw adds two u8 * s8 products into an int16 with saturation;
//      here u <= 63 (q4 codes <= 15, q5 codes <= 31, q6 codes <= 63) and |a| <= 127, so a pair is at most 2 * 63 * 127 = 16002 <
//      32767: never saturated. q8_0's weights are signed (stored + 128, up to 255: a pair could reach 64770), so
//      dot_q8 takes |w| and a with w's sign instead: |w| <= 128, |a| <= 127, a pair <= 2 * 128 * 127 = 32512.
//      (Only q8_0 takes these on AVX2: the other formats' codes are small enough to add several vpmaddubsw in int16
//      before one vpmaddwd, int8_sums_avx2.h.)
//   0: scalar (a build without AVX2; the engine does not run it, it keeps the library whole).
#pragma once

#include "int8_blocks.h"

namespace eagle_trt {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int kInt8Dot = 3;
#elif defined(__AVXVNNI__)
constexpr int kInt8Dot = 2;
#elif defined(__AVX2__)
constexpr int kInt8Dot = 1;
#else
constexpr int kInt8Dot = 0;
#endif

#if defined(__AVX2__)
typedef int32_t v8i __attribute__((vector_size(32)));

inline __m256i half_of(v16i v, int h) {
    return h ? reinterpret_cast<__m256i>(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15))
             : reinterpret_cast<__m256i>(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7));
}

inline v16i join(__m256i lo, __m256i hi) {
    return __builtin_shufflevector(reinterpret_cast<v8i>(lo), reinterpret_cast<v8i>(hi), 0, 1, 2, 3, 4, 5, 6, 7, 8,
                                   9, 10, 11, 12, 13, 14, 15);
}
#endif

// acc + the 4-byte dot of u (unsigned) and the quad a (signed) in every lane.
inline v16i dot4(v16i acc, v16u u, int32_t a) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return reinterpret_cast<v16i>(_mm512_dpbusd_epi32(reinterpret_cast<__m512i>(acc), reinterpret_cast<__m512i>(u),
                                                      _mm512_set1_epi32(a)));
#elif defined(__AVXVNNI__)
    const __m256i b = _mm256_set1_epi32(a);
    const v16i uv = reinterpret_cast<v16i>(u);
    return join(_mm256_dpbusd_avx_epi32(half_of(acc, 0), half_of(uv, 0), b),
                _mm256_dpbusd_avx_epi32(half_of(acc, 1), half_of(uv, 1), b));
#elif defined(__AVX2__)
    const __m256i b = _mm256_set1_epi32(a), ones = _mm256_set1_epi16(1);
    const v16i uv = reinterpret_cast<v16i>(u);
    const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(half_of(uv, 0), b), ones);
    const __m256i hi = _mm256_madd_epi16(_mm256_maddubs_epi16(half_of(uv, 1), b), ones);
    return acc + join(lo, hi);
#else
    v16i r = acc;
    for (int l = 0; l < 16; ++l)
        for (int t = 0; t < 4; ++t)
            r[l] += static_cast<int32_t>((u[l] >> (8 * t)) & 0xFF) * static_cast<int8_t>((a >> (8 * t)) & 0xFF);
    return r;
#endif
}

// acc + lo16(p) * lo16(b) + hi16(p) * hi16(b) in every lane (p: two int16 a lane; b broadcast), exact in int32.
inline v16i madd16(v16i acc, v16i p, int32_t b) {
#if defined(__AVX512BW__)
    return acc + reinterpret_cast<v16i>(_mm512_madd_epi16(reinterpret_cast<__m512i>(p), _mm512_set1_epi32(b)));
#elif defined(__AVX2__)
    const __m256i bb = _mm256_set1_epi32(b);
    return acc + join(_mm256_madd_epi16(half_of(p, 0), bb), _mm256_madd_epi16(half_of(p, 1), bb));
#else
    v16i r = acc;
    const int32_t b0 = static_cast<int16_t>(b & 0xFFFF), b1 = static_cast<int16_t>(b >> 16);
    for (int l = 0; l < 16; ++l) r[l] += static_cast<int16_t>(p[l] & 0xFFFF) * b0 + static_cast<int16_t>(p[l] >> 16) * b1;
    return r;
#endif
}

// What dot_q8 adds beyond sum w a per unit of the activation block's sum S: 128 where it takes the stored u = w + 128
// as it is, 0 where it takes w's sign (AVX2).
constexpr int32_t kQ8Offset = kInt8Dot == 1 ? 0 : 128;

// acc + the 4-byte dot of q8_0's stored u = w + 128 and a, plus kQ8Offset times the quad's sum of a.
inline v16i dot_q8(v16i acc, v16u u, int32_t a) {
#if defined(__AVX2__) && !defined(__AVXVNNI__) && !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
    const __m256i b = _mm256_set1_epi32(a), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(-128);
    const v16i uv = reinterpret_cast<v16i>(u);
    __m256i h[2];
    for (int i = 0; i < 2; ++i) {
        const __m256i w = _mm256_xor_si256(half_of(uv, i), flip);  // the signed weights
        h[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(b, w)), ones);
    }
    return acc + join(h[0], h[1]);
#else
    return dot4(acc, u, a);
#endif
}

// The fp32 block step of int8_blocks.h's formula, which the vector path and the AMX-INT8 tiles (gemm_int8_amx.cpp) both
// take; under the mutation test's define the last row of a many-row call rounds the product apart from the sum
// (tests/test_native_mutation.py shows the row checks catch it on either path).
inline v16f step(v16f scale, v16i i, v16f acc, bool perturb) {
#ifdef EAGLE_TRT_MUTATE_GEMM
    if (perturb) return acc + scale * to_f32(i);
#else
    (void)perturb;
#endif
    return fma16(scale, to_f32(i), acc);
}

// q5_0's code vectors j (k = 4j + t) and j + 4 (k = 16 + 4j + t): nibbles, and the fifth bit moved to bit 4 of each
// byte by a 32-bit shift (bits that cross a byte are masked off).
template <int j>
inline void q5_codes(v16u v, v16u h, v16u& lo, v16u& hi) {
    lo = (v & 0x0F0F0F0Fu) | ((h << (4 - j)) & 0x10101010u);
    hi = ((v >> 4) & 0x0F0F0F0Fu) | ((h >> j) & 0x10101010u);
}

// A q6_k code vector: 4 low bits from the nibble vector, 2 high bits from bits 2j, 2j + 1 of the high vector (moved
// to bits 4, 5 of each byte by a 32-bit shift: the bits that cross a byte are masked off).
template <int j>
inline v16u q6_codes(v16u nib, v16u high) {
    const v16u h = j == 0 ? high << 4 : j == 1 ? high << 2 : j == 2 ? high : high >> 2;
    return (nib & 0x0F0F0F0Fu) | (h & 0x30303030u);
}

}  // namespace eagle_trt
