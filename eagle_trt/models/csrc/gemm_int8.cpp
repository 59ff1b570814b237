// Projections y = x @ W^T over block weights repacked for int8 activations (int8_blocks.h: the formula, the layout
// and why each output is a function of its own row of x alone, the same bits on every ISA).
//
// The weight is one self-describing buffer (models/native/int8_gemm.py writes it): a header of int64 words (magic,
// K, N, the segment count, then per segment its format, rows, bytes per 16-row group and byte offset) and each
// segment's groups. A call quantizes its rows of x once (Q32 and/or Q256, as the segments need), then every thread
// takes a contiguous range of groups (threads split output rows, never a sum) and, per group, register blocks of up
// to max_rows activation rows share each loaded weight vector: a T-row verify streams the weight once, not T times.
// From amx_min_rows rows on, where the CPU has AMX-INT8, a group goes through the tiles instead (gemm_int8_amx.cpp):
// the same integers and fp32 steps, so the same bits, with the weight unpacked once for 16 rows.

#include <cstdint>
#include <cstring>

#include "int8_amx.h"
#include "int8_blocks.h"
#include "int8_dot.h"
#include "int8_sums_avx2.h"
#include "kernels.h"
#include "simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using namespace eagle_trt;

constexpr int64_t kMaxSegments = 4;
constexpr int64_t kHeaderWords = 8 + 4 * kMaxSegments;
constexpr int kRows = 4;

// The most rows one pass over a group's weights takes for a format. AVX-512: 4 (k-quants: 3 int32 and 1 fp32
// accumulators a row, of 32 registers). Without it there are 16 registers and each 16-lane value takes two: 2 rows,
// but for the AVX2 build's int8_sums_avx2.h, which works half a group at a time and leaves room for 4 (q8_0's
// 16-lane dot_q8 spills past 3).
constexpr int64_t max_rows(int64_t format) {
#if defined(__AVX512F__)
    return (void)format, 4;
#else
    return kInt8Dot != 1 ? 2 : format == kQ8_0 ? 3 : 4;
#endif
}

using Segment = Int8Segment;

// Calls of at least this many rows take the tile path where there is one (eagle_trt_int8_set_amx_rows).
int64_t amx_min_rows = 8;

// How far ahead of the block it computes the vector path asks for the weight stream, in bytes (0: it does not ask;
// eagle_trt_int8_set_prefetch). A thread streams its groups front to back, and the hardware prefetchers restart at
// every 4 KiB page, where the bytes of a few-row call then come late; where that costs (the Intel CPUs measured,
// docs/bench.md) a software prefetch one or two blocks ahead keeps them coming. On AMD it stays 0: the AVX2-only
// EPYC measured ran every row count slower with it, and the others did with an earlier scheme. Prefetching reads
// nothing into the results: the bits do not depend on it.
int64_t default_prefetch() {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") ? 4096 : 0;
}
int64_t prefetch_bytes = default_prefetch();

// The lines of the block `prefetch_bytes` past the one at g (bytes long) that a group's loop is about to read, into
// L2 (PREFETCHT1): into L1 the same requests made 3- and 4-row calls slower and 1-row calls no faster.
inline void prefetch_ahead(const uint8_t* g, int64_t bytes) {
    if (prefetch_bytes <= 0) return;
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(g + prefetch_bytes + o, 0, 2);
}

int read_weight(const uint8_t* w, int64_t K, int64_t N, int64_t& n, Segment* seg) {
    int64_t h[kHeaderWords];
    std::memcpy(h, w, sizeof h);
    if (h[0] != kInt8Magic || h[1] != K || h[2] != N || h[3] < 1 || h[3] > kMaxSegments) return -2;
    n = h[3];
    int64_t rows = 0;
    for (int64_t s = 0; s < n; ++s) {
        const int64_t* e = h + 8 + 4 * s;
        seg[s] = Segment{e[0], e[1], e[2], e[3]};
        if (e[1] <= 0 || int8_group_bytes(e[0], K) != e[2] || e[3] < kHeaderWords * 8) return -2;
        rows += e[1];
    }
    return rows == N ? 0 : -2;
}

template <int R>
void group_q8_0(const uint8_t* g, int64_t K, const QRow* q, v16f* acc, bool perturb) {
    for (int64_t b = 0; b < K / 32; ++b, g += 544) {
        prefetch_ahead(g, 544);
        v16i dot[R] = {};
        for (int j = 0; j < 8; ++j) {
            const v16u v = load_quads(g + 32 + 64 * j);
            for (int r = 0; r < R; ++r) dot[r] = dot_q8(dot[r], v, load_quad(q[r].a + 32 * b + 4 * j));
        }
        const v16f d = halves16(g);
        for (int r = 0; r < R; ++r)
            acc[r] = step(d * q[r].d[b], dot[r] - kQ8Offset * q[r].s[b], acc[r], perturb && r == R - 1);
    }
}

// The dot products of a 32-block's four nibble vectors at v (q4_0's and q4_1's layout) with each row's codes, added
// to dot (zero on entry).
template <int R>
inline void nibble_sums(const uint8_t* v, const QRow* q, int64_t b, v16i* dot) {
#if defined(__AVX2__)
    if constexpr (kInt8Dot == 1) return avx2::nibble_sums<R>(v, q, b, dot);
#endif
    for (int j = 0; j < 4; ++j) {
        const v16u w = load_quads(v + 64 * j), lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
        for (int r = 0; r < R; ++r) {
            dot[r] = dot4(dot[r], lo, load_quad(q[r].a + 32 * b + 4 * j));
            dot[r] = dot4(dot[r], hi, load_quad(q[r].a + 32 * b + 16 + 4 * j));
        }
    }
}

template <int R>
void group_q4_0(const uint8_t* g, int64_t K, const QRow* q, v16f* acc, bool perturb) {
    for (int64_t b = 0; b < K / 32; ++b, g += 288) {
        prefetch_ahead(g, 288);
        v16i dot[R] = {};
        nibble_sums<R>(g + 32, q, b, dot);
        const v16f d = halves16(g);
        for (int r = 0; r < R; ++r) acc[r] = step(d * q[r].d[b], dot[r] - 8 * q[r].s[b], acc[r], perturb && r == R - 1);
    }
}

template <int R>
void group_q4_1(const uint8_t* g, int64_t K, const QRow* q, v16f* acc, bool perturb) {
    for (int64_t b = 0; b < K / 32; ++b, g += 320) {
        prefetch_ahead(g, 320);
        v16i dot[R] = {};
        nibble_sums<R>(g + 64, q, b, dot);
        const v16f d = halves16(g), m = halves16(g + 32);
        for (int r = 0; r < R; ++r) {
            acc[r] = step(d * q[r].d[b], dot[r], acc[r], false);
            acc[r] = step(m * q[r].d[b], v16i{} + q[r].s[b], acc[r], perturb && r == R - 1);
        }
    }
}

template <int R, int j>
inline void q5_quad(const uint8_t* g, const QRow* q, int64_t b, v16i* dot) {
    v16u lo, hi;
    q5_codes<j>(load_quads(g + 32 + 64 * j), load_quads(g + 288), lo, hi);
    for (int r = 0; r < R; ++r) {
        dot[r] = dot4(dot[r], lo, load_quad(q[r].a + 32 * b + 4 * j));
        dot[r] = dot4(dot[r], hi, load_quad(q[r].a + 32 * b + 16 + 4 * j));
    }
}

// q5_0's sum q a (before the offset's -16 S) of the 32-block at g for every row, added to dot (zero on entry).
template <int R>
inline void q5_sums(const uint8_t* g, const QRow* q, int64_t b, v16i* dot) {
#if defined(__AVX2__)
    if constexpr (kInt8Dot == 1) return avx2::q5_sums<R>(g, q, b, dot);
#endif
    q5_quad<R, 0>(g, q, b, dot);
    q5_quad<R, 1>(g, q, b, dot);
    q5_quad<R, 2>(g, q, b, dot);
    q5_quad<R, 3>(g, q, b, dot);
}

template <int R>
void group_q5_0(const uint8_t* g, int64_t K, const QRow* q, v16f* acc, bool perturb) {
    for (int64_t b = 0; b < K / 32; ++b, g += 352) {
        prefetch_ahead(g, 352);
        v16i dot[R] = {};
        q5_sums<R>(g, q, b, dot);
        const v16f d = halves16(g);
        for (int r = 0; r < R; ++r)
            acc[r] = step(d * q[r].d[b], dot[r] - 16 * q[r].s[b], acc[r], perturb && r == R - 1);
    }
}

// q4_k's I (int8_blocks.h) of the 256-block at g for every row, added to I (zero on entry).
template <int R>
inline void q4_k_sums(const uint8_t* g, const QRow* q, int64_t b, v16i* I) {
#if defined(__AVX2__)
    if constexpr (kInt8Dot == 1) return avx2::q4_k_sums<R>(g, q, b, I);
#endif
    for (int c = 0; c < 4; ++c) {
        // P chains a sum where few rows leave the dot products' latency exposed (integer sums: any order).
        constexpr int P = R <= 2 ? 2 : 1;
        v16i lo_dot[R][P] = {}, hi_dot[R][P] = {};
        for (int j = 0; j < 8; ++j) {
            const v16u v = load_quads(g + 320 + 512 * c + 64 * j), lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
            for (int r = 0; r < R; ++r) {
                const int8_t* a = q[r].a + 256 * b + 64 * c + 4 * j;
                lo_dot[r][j % P] = dot4(lo_dot[r][j % P], lo, load_quad(a));
                hi_dot[r][j % P] = dot4(hi_dot[r][j % P], hi, load_quad(a + 32));
            }
        }
        const v16i s_lo = u8_lanes(g + 64 + 32 * c), s_hi = u8_lanes(g + 80 + 32 * c);
        for (int r = 0; r < R; ++r)
            for (int p = 0; p < P; ++p) I[r] += s_lo * lo_dot[r][p] + s_hi * hi_dot[r][p];
    }
}

template <int R>
void group_q4_k(const uint8_t* g, int64_t K, const QRow* q, v16f* acc, bool perturb) {
    for (int64_t b = 0; b < K / 256; ++b, g += 2368) {
        prefetch_ahead(g, 2368);
        v16i I[R] = {}, J[R] = {};
        q4_k_sums<R>(g, q, b, I);
        for (int p = 0; p < 4; ++p) {
            const v16i m = u8_pairs(g + 192 + 32 * p);
            for (int r = 0; r < R; ++r) J[r] = madd16(J[r], m, q[r].sp[4 * b + p]);
        }
        const v16f d = halves16(g), dmin = halves16(g + 32);
        for (int r = 0; r < R; ++r) {
            acc[r] = step(d * q[r].d[b], I[r], acc[r], false);
            acc[r] = step(-(dmin * q[r].d[b]), J[r], acc[r], perturb && r == R - 1);
        }
    }
}

template <int R, int j>
inline void q6_quad(const uint8_t* ch, const int8_t* const* a, v16i* lo_dot, v16i* hi_dot) {
    const v16u v = load_quads(ch + 64 * j);
    const v16u lo = q6_codes<j>(v, load_quads(ch + 256)), hi = q6_codes<j>(v >> 4, load_quads(ch + 320));
    for (int r = 0; r < R; ++r) {
        lo_dot[r] = dot4(lo_dot[r], lo, load_quad(a[r] + 4 * j));
        hi_dot[r] = dot4(hi_dot[r], hi, load_quad(a[r] + 16 + 4 * j));
    }
}

// q6_k's I (int8_blocks.h) of the 256-block at g for every row, added to I (zero on entry).
template <int R>
inline void q6_k_sums(const uint8_t* g, const QRow* q, int64_t b, v16i* I) {
#if defined(__AVX2__)
    if constexpr (kInt8Dot == 1) return avx2::q6_k_sums<R>(g, q, b, I);
#endif
    for (int c = 0; c < 8; ++c) {
        const uint8_t* ch = g + 288 + 384 * c;
        const int8_t* a[R];
        for (int r = 0; r < R; ++r) a[r] = q[r].a + 256 * b + 32 * c;
        v16i lo_dot[R] = {}, hi_dot[R] = {};
        q6_quad<R, 0>(ch, a, lo_dot, hi_dot);
        q6_quad<R, 1>(ch, a, lo_dot, hi_dot);
        q6_quad<R, 2>(ch, a, lo_dot, hi_dot);
        q6_quad<R, 3>(ch, a, lo_dot, hi_dot);
        const v16i s_lo = s8_lanes(g + 32 + 32 * c), s_hi = s8_lanes(g + 48 + 32 * c);
        for (int r = 0; r < R; ++r) {
            const int16_t* s = q[r].s16 + 16 * b + 2 * c;
            I[r] += s_lo * (lo_dot[r] - 32 * s[0]) + s_hi * (hi_dot[r] - 32 * s[1]);
        }
    }
}

template <int R>
void group_q6_k(const uint8_t* g, int64_t K, const QRow* q, v16f* acc, bool perturb) {
    for (int64_t b = 0; b < K / 256; ++b, g += 3360) {
        prefetch_ahead(g, 3360);
        v16i I[R] = {};
        q6_k_sums<R>(g, q, b, I);
        const v16f d = halves16(g);
        for (int r = 0; r < R; ++r) acc[r] = step(d * q[r].d[b], I[r], acc[r], perturb && r == R - 1);
    }
}

template <int R>
void group_dot(int64_t format, const uint8_t* g, int64_t K, const QRow* q, v16f* acc, bool perturb) {
    for (int r = 0; r < R; ++r) acc[r] = v16f{};
    switch (format) {
        case kQ8_0: group_q8_0<R>(g, K, q, acc, perturb); break;
        case kQ4_0: group_q4_0<R>(g, K, q, acc, perturb); break;
        case kQ4_1: group_q4_1<R>(g, K, q, acc, perturb); break;
        case kQ5_0: group_q5_0<R>(g, K, q, acc, perturb); break;
        case kQ4_K: group_q4_k<R>(g, K, q, acc, perturb); break;
        default: group_q6_k<R>(g, K, q, acc, perturb); break;
    }
}

using GroupFn = void (*)(int64_t, const uint8_t*, int64_t, const QRow*, v16f*, bool);
constexpr GroupFn kTable[kRows] = {group_dot<1>, group_dot<2>, group_dot<3>, group_dot<4>};

inline bool is_q32(int64_t format) {
    return format == kQ8_0 || format == kQ4_0 || format == kQ4_1 || format == kQ5_0;
}

inline int64_t pad64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// The call's rows quantized (Q32 into rows[0 .. M), Q256 into rows[M .. 2M), as the weight needs), in a per-thread
// buffer kept across calls: false when it could not be allocated. Row m's codes of either kind lie `stride` bytes
// after row m - 1's (tiles[0]: Q32, tiles[1]: Q256), and with pad the rows up to the next multiple of 16 are zero
// codes, for the tiles, which load 16 rows.
template <typename T>
bool quantize_rows(const T* x, int64_t M, int64_t K, bool need32, bool need256, bool pad, QRow*& rows,
                   TileRows* tiles) {
    const int64_t row32 = pad64(K) + 2 * pad64(K / 32 * 4);
    const int64_t row256 = pad64(K) + pad64(K / 256 * 4) + pad64(K / 16 * 2) + pad64(K / 32 * 4);
    const int64_t per = (need32 ? row32 : 0) + (need256 ? row256 : 0);
    const int64_t padded = pad ? (M + 15) / 16 * 16 : M;
    static thread_local Buffer b_q, b_rows, b_x;
    uint8_t* p = b_q.get<uint8_t>(static_cast<size_t>(padded * per));
    rows = b_rows.get<QRow>(static_cast<size_t>(2 * M));
    float* xf = b_x.get(static_cast<size_t>(K));
    if (!p || !rows || !xf) return false;
    tiles[0] = TileRows{reinterpret_cast<const int8_t*>(p), per};
    tiles[1] = TileRows{reinterpret_cast<const int8_t*>(p + (need32 ? row32 : 0)), per};
    for (int64_t m = M; m < padded; ++m) {
        if (need32) std::memset(p + m * per, 0, static_cast<size_t>(K));
        if (need256) std::memset(p + m * per + (need32 ? row32 : 0), 0, static_cast<size_t>(K));
    }
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t k = 0; k < K; ++k) xf[k] = Elem<T>::get(x + m * K + k);
        if (need32) {
            auto* a = reinterpret_cast<int8_t*>(p);
            auto* d = reinterpret_cast<float*>(p + pad64(K));
            auto* s = reinterpret_cast<int32_t*>(p + pad64(K) + pad64(K / 32 * 4));
            int8_quantize_row(xf, K, 32, a, d, s, nullptr);
            rows[m] = QRow{a, d, s, nullptr, nullptr};
            p += row32;
        }
        if (need256) {
            auto* a = reinterpret_cast<int8_t*>(p);
            auto* d = reinterpret_cast<float*>(p + pad64(K));
            auto* s16 = reinterpret_cast<int16_t*>(p + pad64(K) + pad64(K / 256 * 4));
            auto* sp = reinterpret_cast<int32_t*>(p + pad64(K) + pad64(K / 256 * 4) + pad64(K / 16 * 2));
            int8_quantize_row(xf, K, 256, a, d, sp, s16);
            for (int64_t i = 0; i < K / 64; ++i)  // in place: pair i reads sums 2i, 2i + 1 (>= i)
                sp[i] = static_cast<int32_t>((static_cast<uint32_t>(sp[2 * i]) & 0xFFFFu) |
                                             (static_cast<uint32_t>(sp[2 * i + 1]) << 16));
            rows[M + m] = QRow{a, d, nullptr, s16, sp};
            p += row256;
        }
    }
    return true;
}

// Group lg of segment s for every row of x: register blocks of rows (as even as max_rows allows), stored to out.
template <typename T>
void run_group(const uint8_t* w, const Segment& s, int64_t lg, int64_t n0, const QRow* q, int64_t M, int64_t K,
               int64_t N, T* out) {
    const uint8_t* g = w + s.offset + lg * s.group_bytes;
    const int64_t valid = s.rows - lg * kGroup < kGroup ? s.rows - lg * kGroup : kGroup;
    const int64_t most = max_rows(s.format), blocks = (M + most - 1) / most, base = M / blocks, extra = M % blocks;
    v16f acc[kRows];
    for (int64_t b = 0, r0 = 0; b < blocks; ++b) {
        const int64_t rows = base + (b < extra);
        kTable[rows - 1](s.format, g, K, q + r0, acc, M > 1 && r0 + rows == M);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t l = 0; l < valid; ++l) Elem<T>::put(out + (r0 + r) * N + n0 + l, acc[r][l]);
        r0 += rows;
    }
}

template <typename T>
int int8_gemm(const T* x, const uint8_t* w, T* out, int64_t M, int64_t K, int64_t N, int threads) {
    int64_t n;
    Segment seg[kMaxSegments];
    if (read_weight(w, K, N, n, seg)) return -2;
    bool need32 = false, need256 = false;
    int64_t groups = 0;
    for (int64_t s = 0; s < n; ++s) {
        (is_q32(seg[s].format) ? need32 : need256) = true;
        groups += (seg[s].rows + kGroup - 1) / kGroup;
    }
    const bool tiles = M >= amx_min_rows && int8_amx_ready();
    QRow* rows = nullptr;
    TileRows codes[2];
    if (!quantize_rows(x, M, K, need32, need256, tiles, rows, codes)) return -1;
    const int nthreads = threads > 0 ? threads : 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && groups > 1)
    {
#ifdef _OPENMP
        const int64_t tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int64_t tid = 0, nt = 1;
#endif
        alignas(64) uint8_t saved[64] = {};
        if (tiles) int8_amx_configure(saved, M);
        const int64_t g0 = groups * tid / nt, g1 = groups * (tid + 1) / nt;
        int64_t s = 0, first = 0, n0 = 0;  // segment s's groups start at global group `first`, its rows at n0
        for (int64_t gi = g0; gi < g1; ++gi) {
            while (gi - first >= (seg[s].rows + kGroup - 1) / kGroup) {
                first += (seg[s].rows + kGroup - 1) / kGroup;
                n0 += seg[s].rows;
                ++s;
            }
            const bool q32 = is_q32(seg[s].format);
            const QRow* q = q32 ? rows : rows + M;
            const int64_t col = n0 + (gi - first) * kGroup;
            if (tiles) int8_amx_group(w, seg[s], gi - first, col, q, codes[q32 ? 0 : 1], M, K, N, out);
            else run_group(w, seg[s], gi - first, col, q, M, K, N, out);
        }
        if (tiles) int8_amx_restore(saved);
    }
    return 0;
}

}  // namespace

namespace eagle_trt {

int int8_blocks_gemm(const void* x, const uint8_t* w, void* out, int64_t M, int64_t K, int64_t N, int bf16,
                     int threads) {
    if (bf16) return int8_gemm(static_cast<const uint16_t*>(x), w, static_cast<uint16_t*>(out), M, K, N, threads);
    return int8_gemm(static_cast<const float*>(x), w, static_cast<float*>(out), M, K, N, threads);
}

}  // namespace eagle_trt

extern "C" {

// 1 where many-row calls go through AMX-INT8 tiles (this build has them and the process was granted them), else 0.
int eagle_trt_int8_amx(void) { return eagle_trt::int8_amx_ready() ? 1 : 0; }

// Calls of at least `rows` rows take the tile path where there is one (both paths give the same bits; benchmarks and
// tests move the switch). Returns the previous threshold; rows <= 0 only reads it. Not for use while a call runs.
int64_t eagle_trt_int8_set_amx_rows(int64_t rows) {
    const int64_t before = amx_min_rows;
    if (rows > 0) amx_min_rows = rows;
    return before;
}

// The vector path's software prefetch distance in bytes (0 turns it off; the bits are the same either way). Returns
// the previous distance; bytes < 0 only reads it. Not for use while a call runs.
int64_t eagle_trt_int8_set_prefetch(int64_t bytes) {
    const int64_t before = prefetch_bytes;
    if (bytes >= 0) prefetch_bytes = bytes;
    return before;
}

}  // extern "C"
