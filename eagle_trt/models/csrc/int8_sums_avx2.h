// The exact int32 block sums of the int8 block projections (int8_blocks.h's I per block, lane and row) for the AVX2
// build, which has no integer dot product that sums in int32. Each 4-byte dot is a vpmaddubsw: two u8 * s8 products
// added into an int16, saturating only past 32767. Where the codes are small enough, several of those int16 sums are
// added in int16 before one vpmaddwd widens them, and a sub-block's scale rides in that vpmaddwd instead of a 32-bit
// multiply: half the multiplies of widening every dot (int8_dot.h's dot4). The bounds that keep every int16 sum
// exact (|a| <= 127 always):
//   q4 codes <= 15: one vpmaddubsw <= 2 * 15 * 127 = 3810, eight of them <= 30480;
//   q5 codes <= 31: <= 7874, four <= 31496;
//   q6 codes <= 63: <= 16002, two <= 32004.
// q8_0 (|w| <= 128: 32512 a vpmaddubsw) cannot add two and keeps dot_q8. The integers are int8_blocks.h's, summed in
// another order (integer sums: any order), so the bits equal every other ISA's.
// The layout of a block is int8_blocks.h's; lanes are output rows, and each 32-byte half of a quad vector is 8 of
// them, so the functions run half h (rows 8h .. 8h + 7) at a time.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include "int8_blocks.h"

namespace eagle_trt::avx2 {

inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Row a's 4-byte quad at p, in every lane.
inline __m256i quad(const int8_t* p) { return _mm256_set1_epi32(load_quad(p)); }

// 8 bytes at p -> 8 int32 lanes.
inline __m256i u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i s8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }

// Lanes x and y (|x|, |y| < 2^15) as the int16 pair (x, y): vpmaddwd with it adds x * (low half) + y * (high half).
inline __m256i pair(__m256i x, __m256i y) {
    return _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(y, 16));
}

inline __m256i widen(__m256i s16) { return _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); }

inline __m256i lo_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i hi_nibbles(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }

// For every row r: sl[r] += the dots of lo with row r's quad at `at`, sh[r] += those of hi with its quad `apart`
// bytes on, in int16 (the callers keep the bounds above). sl and sh may be the same array.
template <int R>
inline void add_dots(__m256i lo, __m256i hi, const QRow* q, int64_t at, int apart, __m256i* sl, __m256i* sh) {
    for (int r = 0; r < R; ++r) {
        sl[r] = _mm256_add_epi16(sl[r], _mm256_maddubs_epi16(lo, quad(q[r].a + at)));
        sh[r] = _mm256_add_epi16(sh[r], _mm256_maddubs_epi16(hi, quad(q[r].a + at + apart)));
    }
}

// q4_0 / q4_1: sum q a over the 32-block b (the four nibble vectors at v), per row; q4 codes: all eight in int16.
template <int R>
inline void nibble_sums(const uint8_t* v, const QRow* q, int64_t b, v16i* I) {
    for (int h = 0; h < 2; ++h) {
        __m256i s[R];
        for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_si256();
        for (int j = 0; j < 4; ++j) {
            const __m256i w = load(v + 64 * j + 32 * h);
            add_dots<R>(lo_nibbles(w), hi_nibbles(w), q, 32 * b + 4 * j, 16, s, s);
        }
        for (int r = 0; r < R; ++r) reinterpret_cast<__m256i*>(&I[r])[h] = widen(s[r]);
    }
}

// q5_0: sum q a over the 32-block at g (before the offset's -16 S); q5 codes: the low and the high four in int16.
template <int R>
inline void q5_sums(const uint8_t* g, const QRow* q, int64_t b, v16i* I) {
    const __m256i five = _mm256_set1_epi8(0x10);
    for (int h = 0; h < 2; ++h) {
        const __m256i top = load(g + 288 + 32 * h);
        __m256i sl[R], sh[R];
        for (int r = 0; r < R; ++r) sl[r] = sh[r] = _mm256_setzero_si256();
        for (int j = 0; j < 4; ++j) {
            const __m256i w = load(g + 32 + 64 * j + 32 * h);
            // int8_dot.h's q5_codes: the fifth bit of k = 4j + t is bit j of byte t, of k = 16 + 4j + t bit 4 + j.
            const __m256i lo = _mm256_or_si256(lo_nibbles(w), _mm256_and_si256(_mm256_slli_epi32(top, 4 - j), five));
            const __m256i hi = _mm256_or_si256(hi_nibbles(w), _mm256_and_si256(_mm256_srli_epi32(top, j), five));
            add_dots<R>(lo, hi, q, 32 * b + 4 * j, 16, sl, sh);
        }
        for (int r = 0; r < R; ++r)
            reinterpret_cast<__m256i*>(&I[r])[h] = _mm256_add_epi32(widen(sl[r]), widen(sh[r]));
    }
}

// q4_k: I = sum_s sc_s sum_s(q a) over the 256-block at g; a chunk's 32-element halves in int16, each widened by a
// vpmaddwd with its sub-block's scale (6-bit) in both int16 halves of the lane.
template <int R>
inline void q4_k_sums(const uint8_t* g, const QRow* q, int64_t b, v16i* I) {
    for (int h = 0; h < 2; ++h) {
        __m256i acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
            __m256i sl[R], sh[R];
            for (int r = 0; r < R; ++r) sl[r] = sh[r] = _mm256_setzero_si256();
            for (int j = 0; j < 8; ++j) {
                const __m256i w = load(g + 320 + 512 * c + 64 * j + 32 * h);
                add_dots<R>(lo_nibbles(w), hi_nibbles(w), q, 256 * b + 64 * c + 4 * j, 32, sl, sh);
            }
            const __m256i s_lo = u8x8(g + 64 + 32 * c + 8 * h), s_hi = u8x8(g + 80 + 32 * c + 8 * h);
            const __m256i p_lo = pair(s_lo, s_lo), p_hi = pair(s_hi, s_hi);
            for (int r = 0; r < R; ++r)
                acc[r] = _mm256_add_epi32(acc[r], _mm256_add_epi32(_mm256_madd_epi16(sl[r], p_lo),
                                                                   _mm256_madd_epi16(sh[r], p_hi)));
        }
        for (int r = 0; r < R; ++r) reinterpret_cast<__m256i*>(&I[r])[h] = acc[r];
    }
}

// int8_dot.h's q6_codes on one half: the nibbles of `nib` and bits 2j, 2j + 1 of `high` moved to bits 4, 5.
template <int j>
inline __m256i q6_half(__m256i nib, __m256i high) {
    const __m256i h = j == 0 ? _mm256_slli_epi32(high, 4)
                      : j == 1 ? _mm256_slli_epi32(high, 2)
                      : j == 2 ? high
                               : _mm256_srli_epi32(high, 2);
    return _mm256_or_si256(lo_nibbles(nib), _mm256_and_si256(h, _mm256_set1_epi8(0x30)));
}

// Quad vectors j and j + 1 of a q6_k chunk for every row, added in int16 (two q6 dots: exact).
template <int R, int j>
inline void q6_two(const uint8_t* ch, int h, const int8_t* const* a, __m256i* lo, __m256i* hi) {
    const __m256i v0 = load(ch + 64 * j + 32 * h), v1 = load(ch + 64 * (j + 1) + 32 * h);
    const __m256i hl = load(ch + 256 + 32 * h), hh = load(ch + 320 + 32 * h);
    const __m256i l0 = q6_half<j>(v0, hl), l1 = q6_half<j + 1>(v1, hl);
    const __m256i u0 = q6_half<j>(_mm256_srli_epi32(v0, 4), hh), u1 = q6_half<j + 1>(_mm256_srli_epi32(v1, 4), hh);
    for (int r = 0; r < R; ++r) {
        lo[r] = _mm256_add_epi16(_mm256_maddubs_epi16(l0, quad(a[r] + 4 * j)),
                                 _mm256_maddubs_epi16(l1, quad(a[r] + 4 * j + 4)));
        hi[r] = _mm256_add_epi16(_mm256_maddubs_epi16(u0, quad(a[r] + 16 + 4 * j)),
                                 _mm256_maddubs_epi16(u1, quad(a[r] + 16 + 4 * j + 4)));
    }
}

// q6_k: I = sum_s sc_s (sum_s(q a) - 32 S_s) over the 256-block at g, as sum_s sc_s sum_s(q a) - 32 sum_s sc_s S_s:
// the first through vpmaddwd with the (signed 8-bit) scale in both halves of a lane, the second with the pair
// (sc_2c, sc_2c+1) against the row's (S_2c, S_2c+1).
template <int R>
inline void q6_k_sums(const uint8_t* g, const QRow* q, int64_t b, v16i* I) {
    for (int h = 0; h < 2; ++h) {
        __m256i acc[R], corr[R];
        for (int r = 0; r < R; ++r) acc[r] = corr[r] = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) {
            const uint8_t* ch = g + 288 + 384 * c;
            const int8_t* a[R];
            for (int r = 0; r < R; ++r) a[r] = q[r].a + 256 * b + 32 * c;
            const __m256i s_lo = s8x8(g + 32 + 32 * c + 8 * h), s_hi = s8x8(g + 48 + 32 * c + 8 * h);
            const __m256i p_lo = pair(s_lo, s_lo), p_hi = pair(s_hi, s_hi), p_s = pair(s_lo, s_hi);
            __m256i lo[R], hi[R];
            q6_two<R, 0>(ch, h, a, lo, hi);
            for (int r = 0; r < R; ++r)
                acc[r] = _mm256_add_epi32(acc[r], _mm256_add_epi32(_mm256_madd_epi16(lo[r], p_lo),
                                                                   _mm256_madd_epi16(hi[r], p_hi)));
            q6_two<R, 2>(ch, h, a, lo, hi);
            for (int r = 0; r < R; ++r) {
                acc[r] = _mm256_add_epi32(acc[r], _mm256_add_epi32(_mm256_madd_epi16(lo[r], p_lo),
                                                                   _mm256_madd_epi16(hi[r], p_hi)));
                const auto* s = reinterpret_cast<const int8_t*>(q[r].s16 + 16 * b + 2 * c);  // (S_2c, S_2c+1)
                corr[r] = _mm256_add_epi32(corr[r], _mm256_madd_epi16(p_s, quad(s)));
            }
        }
        for (int r = 0; r < R; ++r)
            reinterpret_cast<__m256i*>(&I[r])[h] = _mm256_sub_epi32(acc[r], _mm256_slli_epi32(corr[r], 5));
    }
}

}  // namespace eagle_trt::avx2
#endif
