// The int8 block projections of many rows on AMX-INT8 tiles (int8_amx.h; the formula and the layout: int8_blocks.h).
//
// The tiles compute int8_blocks.h's integers exactly: int32 sums of int8 products (TDPBSSD / TDPBSUD add in int32
// without saturating, and these sums stay far from its range). Each row then takes its integers through the same
// fp32 steps, in the same order, as the vector path (int8_dot.h's `step`), so the bits are the vector path's and a
// call may take either path. What changes is the work: the vector path unpacks a weight block for every register
// block of 4 rows and spends one dot instruction per row and 4 k; here a weight block is unpacked once into B tiles
// for all the call's rows, and one tile instruction multiplies 16 rows by 16 outputs over 64 k.
//
// q4_k and q6_k: the sub-block scales go into the weight before the product. Per weight, w' = sc * q (q4_k: at most
// 63 * 15; q6_k: sc * (q - 32), within [-4064, 4096]) is split into bytes, w' = lo + 256 * hi (lo in [0, 255], hi
// the rest, signed), two B tiles, so a 256 block's I = sum w' a = C_lo + 256 * C_hi accumulates in two result tiles
// over the whole block: one store of each per 16 rows, and no per-row product with the scales.
// q8_0, q4_0, q5_0 (an fp32 step per block of 32): one result tile per block, its codes less the format's offset
// (signed: I = sum (q - 8) a for q4_0). A tile multiplies 64 k; a block's B tile holds its 32 k and zeros.

#include <cstring>
#include <memory>
#include <vector>

#include "int8_amx.h"
#include "int8_dot.h"
#include "kernels.h"
#include "simd.h"

namespace eagle_trt {

#ifdef EAGLE_TRT_AMX_INT8
namespace {

constexpr int kTileBytes = 1024;  // a B tile: 16 rows (64 k in fours) of 64 bytes (16 outputs x 4 k)
constexpr int kDotInts = 256;     // a stored result tile: 16 rows x 16 int32
constexpr int kTileRows = 16;

// Per thread. kq: a 256 block's 4 x 2 B tiles (lo, hi per 64 k). q32: a pair of blocks' 2 tiles, each with one half
// of zeros (the even block's codes in rows 0-7, the odd block's in rows 8-15), written once at construction.
struct Scratch {
    alignas(64) uint8_t kq[8][kTileBytes];
    alignas(64) uint8_t q32[4][kTileBytes];
    alignas(64) int32_t dot[4][kDotInts];
};

typedef uint8_t v64u8 __attribute__((vector_size(64)));

inline void store_vec(uint8_t* p, v16u v) { std::memcpy(p, &v, 64); }

inline v16u minus(v16u v, uint8_t offset) {  // bytewise q - offset, as a signed byte
    v64u8 b;
    std::memcpy(&b, &v, 64);
    b -= offset;
    std::memcpy(&v, &b, 64);
    return v;
}

inline v16i load_dot(const int32_t* p) { return load64<v16i>(p); }

// The lo and hi bytes of w' = sc * q - off for every byte q of `codes` (unsigned, at most 63), sc the signed scale of
// its 4-byte lane in every byte of sc4 and off = 32 * sc (q6_k) or 0 (q4_k) in both 16-bit halves of off16. The
// even and odd bytes' products come from one multiply-add each with the other byte masked off (no sum: |w'| <= 4096,
// far from int16's saturation), and a bitwise select of the two, one shifted by a byte, gathers each plane.
inline void scaled(v16u codes, __m512i sc4, __m512i off16, uint8_t* lo, uint8_t* hi) {
    const __m512i c = reinterpret_cast<__m512i>(codes);
    const __m512i pe = _mm512_sub_epi16(_mm512_maddubs_epi16(_mm512_and_si512(c, _mm512_set1_epi32(0x00FF00FF)), sc4),
                                        off16);
    const __m512i po = _mm512_sub_epi16(_mm512_maddubs_epi16(_mm512_and_si512(c, _mm512_set1_epi32(0xFF00FF00)), sc4),
                                        off16);
    // byte 2i of a plane from pe's word i, byte 2i + 1 from po's: the low bytes (lo) or the high bytes (hi).
    const __m512i low = _mm512_set1_epi16(0x00FF);
    _mm512_store_si512(lo, _mm512_ternarylogic_epi32(low, pe, _mm512_slli_epi16(po, 8), 0xCA));  // low ? pe : po<<8
    _mm512_store_si512(hi, _mm512_ternarylogic_epi32(low, _mm512_srli_epi16(pe, 8), po, 0xCA));  // low ? pe>>8 : po
}

// A lane's scale (int32 lanes) in each of its 4 bytes, and 32 times it in both 16-bit halves.
inline __m512i bytes4(v16i s) {
    return _mm512_mullo_epi32(_mm512_and_si512(reinterpret_cast<__m512i>(s), _mm512_set1_epi32(0xFF)),
                              _mm512_set1_epi32(0x01010101));
}
inline __m512i halves2(v16i s) {
    return _mm512_mullo_epi32(_mm512_and_si512(reinterpret_cast<__m512i>(s), _mm512_set1_epi32(0xFFFF)),
                              _mm512_set1_epi32(0x00010001));
}

// Tiles: 0 and 1 the results of a 16-row chunk (or of the only chunk, when M <= 16), 4 its x codes; 2, 3 and 5 the
// same for the last chunk of a call whose M > 16 is not a multiple of 16, configured with its rows, so that its
// products cost its rows and not 16 (int8_amx_configure); where there is no such chunk, 5 has every chunk's rows and
// takes x's codes in turn with 4. 6 and 7 weight codes (16 x 64 bytes). GCC's tile intrinsics paste the tile number
// into the instruction, hence literals, and the dots below come in several sets.

// One 64-k step of a k-quant block: x's codes at a (stride apart) into tile A, times the step's lo-byte B tile
// (unsigned) into C_lo and its hi-byte B tile (signed) into C_hi.
#define EAGLE_TRT_KQUANT_STEP(CLO, CHI, A, a, stride, lo, hi) \
    do {                                                       \
        _tile_loadd(A, a, stride);                             \
        _tile_loadd(6, lo, 64);                                \
        _tile_loadd(7, hi, 64);                                \
        _tile_dpbsud(CLO, A, 6);                               \
        _tile_dpbssd(CHI, A, 7);                               \
    } while (0)

// C_lo and C_hi of one 256 block, stored to dot[0], dot[1]: four 64-k steps over the B tiles b[2c] (lo), b[2c + 1],
// x's codes into tile A0 and A1 in turn (one loads while the other multiplies, where both have the chunk's rows).
#define EAGLE_TRT_KQUANT_DOTS(NAME, CLO, CHI, A0, A1)                                                                \
    inline void NAME(const int8_t* a, int64_t stride, const uint8_t (*b)[kTileBytes], int32_t (*dot)[kDotInts]) { \
        _tile_zero(CLO);                                                                                             \
        _tile_zero(CHI);                                                                                             \
        EAGLE_TRT_KQUANT_STEP(CLO, CHI, A0, a, stride, b[0], b[1]);                                                  \
        EAGLE_TRT_KQUANT_STEP(CLO, CHI, A1, a + 64, stride, b[2], b[3]);                                             \
        EAGLE_TRT_KQUANT_STEP(CLO, CHI, A0, a + 128, stride, b[4], b[5]);                                            \
        EAGLE_TRT_KQUANT_STEP(CLO, CHI, A1, a + 192, stride, b[6], b[7]);                                            \
        _tile_stored(CLO, dot[0], 64);                                                                               \
        _tile_stored(CHI, dot[1], 64);                                                                               \
    }
EAGLE_TRT_KQUANT_DOTS(kquant_dots, 0, 1, 4, 5)       // every chunk has the rows of tile 5 (Chunks::rest_tiles false)
EAGLE_TRT_KQUANT_DOTS(kquant_dots_full, 0, 1, 4, 4)  // a full chunk of a call that has a rest
EAGLE_TRT_KQUANT_DOTS(kquant_dots_rest, 2, 3, 5, 5)  // the rest

// Blocks 2p and 2p + 1 of 32 (q32 formats) for the rows at a: dot[0], dot[1]; with `two` false only the first.
#define EAGLE_TRT_PAIR_DOTS(NAME, C0, C1, A)                                                                      \
    inline void NAME(const int8_t* a, int64_t stride, const uint8_t (*b)[kTileBytes], bool two,                 \
                     int32_t (*dot)[kDotInts]) {                                                                \
        _tile_loadd(A, a, stride);                                                                              \
        _tile_loadd(6, b[0], 64);                                                                               \
        _tile_zero(C0);                                                                                         \
        _tile_dpbssd(C0, A, 6);                                                                                 \
        if (two) {                                                                                              \
            _tile_loadd(7, b[1], 64);                                                                           \
            _tile_zero(C1);                                                                                     \
            _tile_dpbssd(C1, A, 7);                                                                             \
        }                                                                                                       \
        _tile_stored(C0, dot[0], 64);                                                                           \
        if (two) _tile_stored(C1, dot[1], 64);                                                                  \
    }
EAGLE_TRT_PAIR_DOTS(pair_dots, 0, 1, 4)
EAGLE_TRT_PAIR_DOTS(pair_dots_rest, 2, 3, 5)

// Where one 16-row chunk of x stands: its first row r0 and its valid rows (R, a template argument below, is 4, 8 or
// 16: the rows the unrolled loops compute; rows past `rows` compute on stale tile rows and are never kept).
struct Chunk {
    const QRow* q;
    int64_t r0, rows, M;
    float* acc;  // the chunk's accumulators, 16 floats a row
    const QRow& row(int r) const { return q[r0 + (r < rows ? r : 0)]; }
    bool perturb(int r) const { return M > 1 && r0 + r == M - 1; }
    bool rest() const { return rows < kTileRows && r0 > 0; }  // the last chunk of fewer rows: tiles 2, 3 and 5
};

// All chunks of a call for one group. A weight block is unpacked into B tiles once and every chunk multiplies it
// before the next block: the unpacking is most of a block's work, so a call of 17 rows costs far less than two of 16.
// One chunk keeps its accumulators in registers over the whole group; several load and store theirs around each
// block, computing 4, 8 or 16 rows as they have (each row's fp32 steps still run in k order: the bits do not depend
// on M).
struct Chunks {
    const Chunk* c;
    int n;
    int64_t ahead;  // bytes from a block of this group to the same block of the next one (prefetched meanwhile)
    bool rest_tiles;  // the last chunk has fewer rows than the others (M > 16, not a multiple): tile 5 is its own
};

template <int R>
inline void load_rows(const Chunk& c, v16f* a) {
    for (int r = 0; r < R; ++r) a[r] = load64<v16f>(c.acc + 16 * (r < c.rows ? r : 0));
}

template <int R>
inline void keep_rows(const Chunk& c, const v16f* a) {
    for (int r = 0; r < R; ++r)
        if (r < c.rows) std::memcpy(c.acc + 16 * r, &a[r], 64);
}

// One block's fp32 steps (`Steps::run<R>(chunk, acc)`, its dots in the scratch) for a chunk of a several-chunk call:
// its accumulators from memory and back, as few rows as it has.
template <int R, typename Steps>
inline void steps_in_memory(const Steps& st, const Chunk& c) {
    v16f a[R];
    load_rows<R>(c, a);
    st.template run<R>(c, a);
    keep_rows<R>(c, a);
}

template <typename Steps>
inline void steps_of_chunk(const Steps& st, const Chunk& c) {
    if (c.rows > 8) steps_in_memory<16>(st, c);
    else if (c.rows > 4) steps_in_memory<8>(st, c);
    else steps_in_memory<4>(st, c);
}

// The weight stream is the bound of a few-row call: the next group's bytes are asked for while this one computes.
inline void prefetch(const uint8_t* p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

// The B tile of one q32 block (its signed codes, q - offset) into rows 0-7 (half 0) or 8-15 (half 1) of tile t.
template <int64_t Fmt>
void q32_tile(const uint8_t* blk, uint8_t* t, int half) {
    constexpr uint8_t offset = Fmt == kQ8_0 ? 0x80 : Fmt == kQ4_0 ? 8 : Fmt == kQ4_1 ? 0 : 16;  // q8_0: w + 128
    uint8_t* rows = t + 512 * half;
    if (Fmt == kQ8_0) {
        for (int j = 0; j < 8; ++j) store_vec(rows + 64 * j, minus(load_quads(blk + 32 + 64 * j), offset));
    } else if (Fmt == kQ4_0 || Fmt == kQ4_1) {
        for (int j = 0; j < 4; ++j) {
            const v16u v = load_quads(blk + (Fmt == kQ4_1 ? 64 : 32) + 64 * j);
            store_vec(rows + 64 * j, minus(v & 0x0F0F0F0Fu, offset));
            store_vec(rows + 256 + 64 * j, minus((v >> 4) & 0x0F0F0F0Fu, offset));
        }
    } else {
        const v16u h = load_quads(blk + 288);
        v16u lo[4], hi[4];
        q5_codes<0>(load_quads(blk + 32), h, lo[0], hi[0]);
        q5_codes<1>(load_quads(blk + 96), h, lo[1], hi[1]);
        q5_codes<2>(load_quads(blk + 160), h, lo[2], hi[2]);
        q5_codes<3>(load_quads(blk + 224), h, lo[3], hi[3]);
        for (int j = 0; j < 4; ++j) {
            store_vec(rows + 64 * j, minus(lo[j], offset));
            store_vec(rows + 256 + 64 * j, minus(hi[j], offset));
        }
    }
}

// The fp32 steps of blocks b0 and (if `two`) b0 + 1 of 32, in k order, their dots in dot[0] and dot[1].
template <int64_t Fmt>
struct Q32Steps {
    const uint8_t* g;
    int64_t b0;
    bool two;
    const int32_t (*dot)[kDotInts];

    template <int R>
    void run(const Chunk& c, v16f* acc) const {
        constexpr int64_t bytes = Fmt == kQ8_0 ? 544 : Fmt == kQ4_0 ? 288 : Fmt == kQ4_1 ? 320 : 352;
        for (int i = 0; i < (two ? 2 : 1); ++i) {
            const int64_t b = b0 + i;
            const v16f d = halves16(g + b * bytes);
            if (Fmt == kQ4_1) {  // and its minimum: m * da times the block's sum of codes
                const v16f m = halves16(g + b * bytes + 32);
                for (int r = 0; r < R; ++r) {
                    const QRow& q = c.row(r);
                    acc[r] = step(d * q.d[b], load_dot(dot[i] + 16 * r), acc[r], false);
                    acc[r] = step(m * q.d[b], v16i{} + q.s[b], acc[r], c.perturb(r));
                }
                continue;
            }
            for (int r = 0; r < R; ++r)
                acc[r] = step(d * c.row(r).d[b], load_dot(dot[i] + 16 * r), acc[r], c.perturb(r));
        }
    }
};

// q8_0, q4_0, q4_1, q5_0: blocks of 32 in pairs, each block's fp32 step per row in k order. R: the rows of a
// one-chunk call.
template <int64_t Fmt, int R>
void blocks_q32(const uint8_t* g, int64_t K, TileRows t, const Chunks& cs, Scratch& s) {
    constexpr int64_t bytes = Fmt == kQ8_0 ? 544 : Fmt == kQ4_0 ? 288 : Fmt == kQ4_1 ? 320 : 352;
    const int64_t blocks = K / 32;
    v16f acc[R];
    if (cs.n == 1) load_rows<R>(cs.c[0], acc);
    for (int64_t b0 = 0; b0 < blocks; b0 += 2) {
        const bool two = b0 + 1 < blocks;
        prefetch(g + b0 * bytes + cs.ahead, 2 * bytes);
        q32_tile<Fmt>(g + b0 * bytes, s.q32[0], 0);
        if (two) q32_tile<Fmt>(g + (b0 + 1) * bytes, s.q32[1], 1);
        const Q32Steps<Fmt> st{g, b0, two, s.dot};
        for (int ci = 0; ci < cs.n; ++ci) {
            const Chunk& c = cs.c[ci];
            const int8_t* a = t.a + c.r0 * t.stride + 32 * b0;
            if (cs.rest_tiles && c.rest()) pair_dots_rest(a, t.stride, s.q32, two, s.dot);
            else pair_dots(a, t.stride, s.q32, two, s.dot);
            if (cs.n == 1) st.template run<R>(c, acc);
            else steps_of_chunk(st, c);
        }
    }
    if (cs.n == 1) keep_rows<R>(cs.c[0], acc);
}

// q4_k's B tiles of one 256 block: per 64 k (chunk ch), rows 0-7 the low nibbles (sub-block 2ch) times their scale,
// rows 8-15 the high nibbles (sub-block 2ch + 1) times theirs, split into lo and hi bytes.
void q4_k_tiles(const uint8_t* blk, uint8_t (*b)[kTileBytes], const uint8_t* next) {
    const __m512i zero = _mm512_setzero_si512();
    for (int ch = 0; ch < 4; ++ch) {
        const __m512i s_lo = bytes4(u8_lanes(blk + 64 + 32 * ch)), s_hi = bytes4(u8_lanes(blk + 80 + 32 * ch));
        for (int j = 0; j < 8; ++j) {
            __builtin_prefetch(next + 128 * (8 * ch + j), 0, 3);  // 37 lines: the loop's 32 steps take two each
            __builtin_prefetch(next + 128 * (8 * ch + j) + 64, 0, 3);
            const v16u v = load_quads(blk + 320 + 512 * ch + 64 * j);
            scaled(v & 0x0F0F0F0Fu, s_lo, zero, b[2 * ch] + 64 * j, b[2 * ch + 1] + 64 * j);
            scaled((v >> 4) & 0x0F0F0F0Fu, s_hi, zero, b[2 * ch] + 512 + 64 * j, b[2 * ch + 1] + 512 + 64 * j);
        }
    }
}

// q6_k's: per 64 k (two chunks of 32), rows 4h + 0-3 the codes of sub-block h of the four, times its scale, less
// 32 times its scale (w' = sc * (q - 32)).
template <int j>
inline void q6_rows(const uint8_t* chunk, const __m512i* sc, uint8_t* lo, uint8_t* hi) {
    const v16u v = load_quads(chunk + 64 * j);
    scaled(q6_codes<j>(v, load_quads(chunk + 256)), sc[0], sc[1], lo + 64 * j, hi + 64 * j);
    scaled(q6_codes<j>(v >> 4, load_quads(chunk + 320)), sc[2], sc[3], lo + 256 + 64 * j, hi + 256 + 64 * j);
}

void q6_k_tiles(const uint8_t* blk, uint8_t (*b)[kTileBytes], const uint8_t* next) {
    for (int c = 0; c < 8; ++c) {  // chunk c of 32 k: tile pair c / 2, rows 8 (c % 2) ..
        const uint8_t* chunk = blk + 288 + 384 * c;
        for (int l = 0; l < 7; ++l) __builtin_prefetch(next + 448 * c + 64 * l, 0, 3);  // 53 lines, 7 a chunk
        const v16i lo_sc = s8_lanes(blk + 32 + 32 * c), hi_sc = s8_lanes(blk + 48 + 32 * c);
        const __m512i sc[4] = {bytes4(lo_sc), halves2(lo_sc * 32), bytes4(hi_sc), halves2(hi_sc * 32)};
        uint8_t* lo = b[2 * (c / 2)] + 512 * (c % 2);
        uint8_t* hi = b[2 * (c / 2) + 1] + 512 * (c % 2);
        q6_rows<0>(chunk, sc, lo, hi);
        q6_rows<1>(chunk, sc, lo, hi);
        q6_rows<2>(chunk, sc, lo, hi);
        q6_rows<3>(chunk, sc, lo, hi);
    }
}

// The fp32 steps of 256 block b of q4_k or q6_k: I = C_lo + 256 C_hi (dot[0], dot[1]), then the block's steps
// (q4_k: and its minimum's).
template <int64_t Fmt>
struct KquantSteps {
    int64_t b;
    v16f d, dmin;
    v16i mins[4];
    const int32_t (*dot)[kDotInts];

    KquantSteps(const uint8_t* blk, int64_t b, const int32_t (*dot)[kDotInts])
        : b(b), d(halves16(blk)), dmin(Fmt == kQ4_K ? halves16(blk + 32) : d), mins{}, dot(dot) {
        if (Fmt == kQ4_K)
            for (int p = 0; p < 4; ++p) mins[p] = u8_pairs(blk + 192 + 32 * p);
    }

    template <int R>
    void run(const Chunk& c, v16f* acc) const {
        for (int r = 0; r < R; ++r) {
            const v16i I = load_dot(dot[0] + 16 * r) + (load_dot(dot[1] + 16 * r) << 8);
            const QRow& q = c.row(r);
            if (Fmt == kQ4_K) {
                v16i J = {};
                for (int p = 0; p < 4; ++p) J = madd16(J, mins[p], q.sp[4 * b + p]);
                acc[r] = step(d * q.d[b], I, acc[r], false);
                acc[r] = step(-(dmin * q.d[b]), J, acc[r], c.perturb(r));
            } else {
                acc[r] = step(d * q.d[b], I, acc[r], c.perturb(r));
            }
        }
    }
};

// q4_k and q6_k: per 256 block, its B tiles once, then every chunk's dots and steps. R: the rows of a one-chunk call.
template <int64_t Fmt, int R>
void blocks_kquant(const uint8_t* g, int64_t K, TileRows t, const Chunks& cs, Scratch& s) {
    constexpr int64_t bytes = Fmt == kQ4_K ? 2368 : 3360;
    v16f acc[R];
    if (cs.n == 1) load_rows<R>(cs.c[0], acc);
    for (int64_t b = 0; b < K / 256; ++b, g += bytes) {
        if (Fmt == kQ4_K) q4_k_tiles(g, s.kq, g + cs.ahead);
        else q6_k_tiles(g, s.kq, g + cs.ahead);
        const KquantSteps<Fmt> st(g, b, s.dot);
        for (int ci = 0; ci < cs.n; ++ci) {
            const Chunk& c = cs.c[ci];
            const int8_t* a = t.a + c.r0 * t.stride + 256 * b;
            if (!cs.rest_tiles) kquant_dots(a, t.stride, s.kq, s.dot);
            else if (c.rest()) kquant_dots_rest(a, t.stride, s.kq, s.dot);
            else kquant_dots_full(a, t.stride, s.kq, s.dot);
            if (cs.n == 1) st.template run<R>(c, acc);
            else steps_of_chunk(st, c);
        }
    }
    if (cs.n == 1) keep_rows<R>(cs.c[0], acc);
}

template <int R>
void group_rows(int64_t format, const uint8_t* g, int64_t K, TileRows t, const Chunks& cs, Scratch& s) {
    switch (format) {
        case kQ8_0: blocks_q32<kQ8_0, R>(g, K, t, cs, s); break;
        case kQ4_0: blocks_q32<kQ4_0, R>(g, K, t, cs, s); break;
        case kQ4_1: blocks_q32<kQ4_1, R>(g, K, t, cs, s); break;
        case kQ5_0: blocks_q32<kQ5_0, R>(g, K, t, cs, s); break;
        case kQ4_K: blocks_kquant<kQ4_K, R>(g, K, t, cs, s); break;
        default: blocks_kquant<kQ6_K, R>(g, K, t, cs, s); break;
    }
}

}  // namespace

bool int8_amx_ready() {
    static const bool granted = request_amx();
    return granted;
}

void int8_amx_configure(void* saved, int64_t M) {
    _tile_storeconfig(saved);
    TileConfig cfg;
    const uint8_t rows = static_cast<uint8_t>(M < kTileRows ? M : kTileRows);
    const uint8_t rest = static_cast<uint8_t>(M > kTileRows && M % kTileRows ? M % kTileRows : rows);
    for (int i : {0, 1, 4}) cfg.rows[i] = rows, cfg.colsb[i] = 64;
    for (int i : {2, 3, 5}) cfg.rows[i] = rest, cfg.colsb[i] = 64;
    for (int i = 6; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    // GCC 12 does not count LDTILECFG as reading the whole 64 bytes and drops the stores above without this.
    asm volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

void int8_amx_restore(const void* saved) { _tile_loadconfig(saved); }  // all zero (nothing was set): releases them

template <typename T>
void int8_amx_group(const uint8_t* w, const Int8Segment& seg, int64_t lg, int64_t n0, const QRow* q, TileRows t,
                    int64_t M, int64_t K, int64_t N, T* out) {
    static thread_local std::unique_ptr<Scratch> scratch(new Scratch());  // value-initialised: zeros
    static thread_local Buffer b_acc;
    Scratch* s = scratch.get();
    float* acc = b_acc.get(static_cast<size_t>(16 * M));
    std::memset(acc, 0, sizeof(float) * 16 * M);
    static thread_local std::vector<Chunk> chunks;
    chunks.clear();
    for (int64_t r0 = 0; r0 < M; r0 += kTileRows)
        chunks.push_back(Chunk{q, r0, M - r0 < kTileRows ? M - r0 : kTileRows, M, acc + 16 * r0});
    const Chunks cs{chunks.data(), static_cast<int>(chunks.size()), seg.group_bytes, M > kTileRows && M % kTileRows};
    const uint8_t* g = w + seg.offset + lg * seg.group_bytes;
    // R of a one-chunk call, whose accumulators stay in registers: 8 rows or 16. Several chunks pick theirs each.
    if (cs.n == 1 && M <= 8) group_rows<8>(seg.format, g, K, t, cs, *s);
    else group_rows<16>(seg.format, g, K, t, cs, *s);
    const int64_t valid = seg.rows - lg * kGroup < kGroup ? seg.rows - lg * kGroup : kGroup;
    for (int64_t r = 0; r < M; ++r)
        for (int64_t l = 0; l < valid; ++l) Elem<T>::put(out + r * N + n0 + l, acc[16 * r + l]);
}

#else  // no AMX-INT8 in this build: the vector path takes every call

bool int8_amx_ready() { return false; }
void int8_amx_configure(void*, int64_t) {}
void int8_amx_restore(const void*) {}
template <typename T>
void int8_amx_group(const uint8_t*, const Int8Segment&, int64_t, int64_t, const QRow*, TileRows, int64_t, int64_t,
                    int64_t, T*) {}

#endif

template void int8_amx_group<float>(const uint8_t*, const Int8Segment&, int64_t, int64_t, const QRow*, TileRows,
                                    int64_t, int64_t, int64_t, float*);
template void int8_amx_group<uint16_t>(const uint8_t*, const Int8Segment&, int64_t, int64_t, const QRow*, TileRows,
                                       int64_t, int64_t, int64_t, uint16_t*);

}  // namespace eagle_trt
