// GGUF block formats as the block projections (gemm_blocks.cpp) read them: each weight row a run of blocks in
// GGUF's byte layout (ggml-common.h: block_q8_0, block_q4_0, block_q4_1, block_q5_0, block_q5_1, block_q4_K,
// block_q5_K, block_q6_K), and
// the de-quantization of a row into fp32.
//
// The invariant: a row de-quantizes to exactly the fp32 values the GGUF reference gives (gguf-py's
// `gguf.quants.dequantize`, which computes what ggml's dequantize_row_* computes): every step below is the same
// fp32 operation in the same order (products of a half-precision scale and a small integer are exact; the one
// rounding, a scale times a code minus a minimum, is a separate multiply and subtract, as -ffp-contract=off keeps
// it). tests/test_native_blocks.py checks it bit for bit per format.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace eagle_trt {

// 16-wide vectors for the de-quantization (two AVX2 registers or one AVX-512 register; GCC lowers them to either).
// Every lane computes exactly what the scalar formula computes for its weight: the same conversions and the same
// fp32 operations in the same order, so a vector path changes no bit.
typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef int32_t v16i32 __attribute__((vector_size(64)));
typedef float v16f __attribute__((vector_size(64)));

inline v16u8 load16(const uint8_t* p) {
    v16u8 v;
    std::memcpy(&v, p, 16);
    return v;
}

inline void store16(float* y, v16f v) { std::memcpy(y, &v, 64); }

inline v16f to_f32(v16u8 q) { return __builtin_convertvector(__builtin_convertvector(q, v16i32), v16f); }

// 16 int8 at p -> their exact fp32 values (GCC's generic conversion of a signed byte vector is scalar code).
inline v16f int8_to_f32(const uint8_t* p) {
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    v16f r;
    std::memcpy(&r, &f, 64);
    return r;
#elif defined(__AVX2__)
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
    v16f r;
    std::memcpy(&r, &lo, 32);
    std::memcpy(reinterpret_cast<char*>(&r) + 32, &hi, 32);
    return r;
#else
    v16f r;
    for (int j = 0; j < 16; ++j) r[j] = static_cast<float>(static_cast<int8_t>(p[j]));
    return r;
#endif
}

// ggml's type ids (the numbers a GGUF file stores), so a format crosses the Python boundary as the GGUF names it.
enum BlockFormat : int64_t {
    kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30,
};

struct BlockShape {
    int64_t elems, bytes;  // weights per block, bytes per block
};

// The block of a format, or {0, 0} for one these kernels do not take.
inline BlockShape block_shape(int64_t format) {
    switch (format) {
        case kF32: return {1, 4};
        case kF16: return {1, 2};
        case kBF16: return {1, 2};
        case kQ8_0: return {32, 34};
        case kQ4_0: return {32, 18};
        case kQ4_1: return {32, 20};
        case kQ5_0: return {32, 22};
        case kQ5_1: return {32, 24};
        case kQ4_K: return {256, 144};
        case kQ5_K: return {256, 176};
        case kQ6_K: return {256, 210};
        default: return {0, 0};
    }
}

// Bytes of one row of K weights, or -1 when K is not a whole number of the format's blocks (or the format unknown).
inline int64_t block_row_bytes(int64_t format, int64_t K) {
    const BlockShape b = block_shape(format);
    if (b.elems == 0 || K <= 0 || K % b.elems) return -1;
    return K / b.elems * b.bytes;
}

// IEEE half -> float, exact (every half is a float), subnormals included.
inline float half_to_float(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);  // the hardware conversion: exact, as below
#endif
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0) {
        const float f = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
        std::memcpy(&u, &f, 4);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// The 6-bit scale and minimum j of a q4_K / q5_K block's 12 packed bytes (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// y[j] = float(qs[j]) * d.
inline void dequant_q8_0(const uint8_t* b, float* y) {
    const float d = half_to_float(b);
    for (int h = 0; h < 2; ++h) store16(y + 16 * h, int8_to_f32(b + 2 + 16 * h) * d);
}

// y[j] = float((qs[j] & 0xF) - 8) * d, y[j + 16] = float((qs[j] >> 4) - 8) * d.
inline void dequant_q4_0(const uint8_t* b, float* y) {
    const float d = half_to_float(b);
    const v16u8 qs = load16(b + 2);
    const v16i32 lo = __builtin_convertvector(qs & 0x0F, v16i32) - 8, hi = __builtin_convertvector(qs >> 4, v16i32) - 8;
    store16(y, __builtin_convertvector(lo, v16f) * d);
    store16(y + 16, __builtin_convertvector(hi, v16f) * d);
}

// y[j] = float(qs[j] & 0xF) * d + m, y[j + 16] = float(qs[j] >> 4) * d + m.
inline void dequant_q4_1(const uint8_t* b, float* y) {
    const float d = half_to_float(b), m = half_to_float(b + 2);
    const v16u8 qs = load16(b + 4);
    store16(y, to_f32(qs & 0x0F) * d + m);
    store16(y + 16, to_f32(qs >> 4) * d + m);
}

// q5_0 (m = null: codes centred on 16) and q5_1 (codes times d plus m): nibbles as q4_0/q4_1, and a little-endian
// 32-bit word whose bit j is weight j's fifth bit.
inline void dequant_q5(const uint8_t* d_at, const uint8_t* m_at, const uint8_t* qh_at, const uint8_t* qs, float* y) {
    const float d = half_to_float(d_at), m = m_at ? half_to_float(m_at) : 0.0f;
    const uint32_t qh = static_cast<uint32_t>(qh_at[0]) | (static_cast<uint32_t>(qh_at[1]) << 8) |
                        (static_cast<uint32_t>(qh_at[2]) << 16) | (static_cast<uint32_t>(qh_at[3]) << 24);
    const int centre = m_at ? 0 : 16;
    for (int j = 0; j < 16; ++j) {
        const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10), h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
        const float x0 = static_cast<float>(((qs[j] & 0x0F) | h0) - centre);
        const float x1 = static_cast<float>(((qs[j] >> 4) | h1) - centre);
        if (m_at) {
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        } else {
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

// q4_K (high = null) and q5_K (high: the 32 bytes of fifth bits): 8 groups of 32, each with its own 6-bit scale
// and minimum, codes in nibbles (64 weights per 32 bytes).
inline void dequant_k4(const uint8_t* b, const uint8_t* qs, const uint8_t* high, float* y) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t* scales = b + 4;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, qs += 32) {
        int sc, m;
        scale_min_k4(is, scales, sc, m);
        const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
        scale_min_k4(is + 1, scales, sc, m);
        const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
        if (!high) {  // q4_K: y = d1 * float(q & 0xF) - m1, y = d2 * float(q >> 4) - m2, 16 lanes at a time
            for (int h = 0; h < 2; ++h) {
                const v16u8 q = load16(qs + 16 * h);
                store16(y + j + 16 * h, d1 * to_f32(q & 0x0F) - m1);
                store16(y + j + 32 + 16 * h, d2 * to_f32(q >> 4) - m2);
            }
            continue;
        }
        const int u1 = 1 << is, u2 = 2 << is;  // this pair of groups' bits in the fifth-bit bytes
        for (int l = 0; l < 32; ++l) {
            const int h1 = high && (high[l] & u1) ? 16 : 0, h2 = high && (high[l] & u2) ? 16 : 0;
            y[j + l] = d1 * static_cast<float>((qs[l] & 0xF) + h1) - m1;
            y[j + 32 + l] = d2 * static_cast<float>((qs[l] >> 4) + h2) - m2;
        }
    }
}

inline void dequant_q6_K(const uint8_t* b, float* y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_to_float(b + 208);
    // y[l + 32 g] = (d * float(sc[is + 2 g])) * float(q_g[l]) with is = l / 16: 16 lanes share a scale.
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int h = 0; h < 2; ++h) {
            const int l = 16 * h;
            const v16u8 a = load16(ql + l), b2 = load16(ql + l + 32), hb = load16(qh + l);
            const v16i32 q1 = __builtin_convertvector((a & 0xF) | (((hb >> 0) & 3) << 4), v16i32) - 32;
            const v16i32 q2 = __builtin_convertvector((b2 & 0xF) | (((hb >> 2) & 3) << 4), v16i32) - 32;
            const v16i32 q3 = __builtin_convertvector((a >> 4) | (((hb >> 4) & 3) << 4), v16i32) - 32;
            const v16i32 q4 = __builtin_convertvector((b2 >> 4) | (((hb >> 6) & 3) << 4), v16i32) - 32;
            store16(y + l, (d * static_cast<float>(sc[h])) * __builtin_convertvector(q1, v16f));
            store16(y + l + 32, (d * static_cast<float>(sc[h + 2])) * __builtin_convertvector(q2, v16f));
            store16(y + l + 64, (d * static_cast<float>(sc[h + 4])) * __builtin_convertvector(q3, v16f));
            store16(y + l + 96, (d * static_cast<float>(sc[h + 6])) * __builtin_convertvector(q4, v16f));
        }
}

// One row of K weights in `format` (block_row_bytes(format, K) bytes at src) -> y[0..K) in fp32.
inline void dequant_row(int64_t format, const uint8_t* src, int64_t K, float* y) {
    const BlockShape s = block_shape(format);
    if (format == kF32) {
        std::memcpy(y, src, K * 4);
        return;
    }
    if (format == kF16 || format == kBF16) {
        for (int64_t k = 0; k < K; ++k) {
            if (format == kF16) {
                y[k] = half_to_float(src + 2 * k);
            } else {
                uint32_t u = static_cast<uint32_t>(src[2 * k] | (src[2 * k + 1] << 8)) << 16;
                std::memcpy(y + k, &u, 4);
            }
        }
        return;
    }
    for (int64_t b = 0; b < K / s.elems; ++b, src += s.bytes, y += s.elems) {
        switch (format) {
            case kQ8_0: dequant_q8_0(src, y); break;
            case kQ4_0: dequant_q4_0(src, y); break;
            case kQ4_1: dequant_q4_1(src, y); break;
            case kQ5_0: dequant_q5(src, nullptr, src + 2, src + 6, y); break;
            case kQ5_1: dequant_q5(src, src + 2, src + 4, src + 8, y); break;
            case kQ4_K: dequant_k4(src, src + 16, nullptr, y); break;
            case kQ5_K: dequant_k4(src, src + 48, src + 16, y); break;
            case kQ6_K: dequant_q6_K(src, y); break;
            default: break;
        }
    }
}

}  // namespace eagle_trt
