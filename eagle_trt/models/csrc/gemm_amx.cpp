// bf16 projections y = x @ W on Intel AMX tiles, with every output row a function of that row of x alone.
//
// Why: a verify pass multiplies T tree rows by each weight, and greedy decoding must give the same bits as
// multiplying each row alone. Here every output element is one chain of tile multiply-adds over K in blocks of
// 32, in the same order whatever the row count: a row's chain does not change with the rows beside it in the tile
// (the instruction treats tile rows independently), and threads split columns, never a sum. And it streams the
// weights once for up to 32 rows (two row tiles share each weight tile), where oneDNN's kernel read them twice past
// 16 rows; at one row it keeps closer to the memory bandwidth (docs/bench.md, `scripts/kernel_timings.py`).
//
// Weights are packed once at load: for each group of 32 output columns, for each block of 32 K, two B tiles
// (16 K-pairs x 16 columns x 2, the pair order the instruction reads). K must be a multiple of 32; columns are
// padded with zeros to a multiple of 32. Rounding to bf16 at the end is to nearest even.
//
// Compiled only where the compiler targets AMX (-march=native on a CPU with amx_tile and amx_bf16); elsewhere
// eagle_trt_amx_available() returns 0 and the engine keeps oneDNN.

#include <cstdint>
#include <cstring>

#include "amx.h"
#include "kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int kGroupCols = 32;  // output columns per group: two 16-column result tiles
constexpr int kBlockK = 32;     // K per tile step (16 bf16 pairs)
constexpr int kPanel = 2 * 16 * 32;  // bf16 elements of one group's two B tiles for one K block
// From this many rows (up to 16) two column groups go through the tiles together; at one row two weight streams were
// slower than one (`scripts/kernel_ab.py`; the numbers are in docs/architecture.md, "CPU kernels").
constexpr int64_t kPairRows = 8;

#ifdef EAGLE_TRT_AMX
using eagle_trt::TileConfig;

// Tiles: 0,1 results of row tile 0 (columns 0-15, 16-31); 2,3 of row tile 1; 4,5 the x row tiles; 6,7 weights.
void configure(int m0, int m1) {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
    cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = static_cast<uint8_t>(m0);
    cfg.rows[2] = cfg.rows[3] = cfg.rows[5] = static_cast<uint8_t>(m1 ? m1 : 1);
    cfg.rows[6] = cfg.rows[7] = 16;
    _tile_loadconfig(&cfg);
}

void store_rows(const float* c, int rows, uint16_t* out, int64_t ldo, int ncols) {
    for (int r = 0; r < rows; ++r) {
        const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(c + r * 16)));
        if (ncols == 16) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo), h);
        } else {
            uint16_t tmp[16];
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(tmp), h);
            std::memcpy(out + r * ldo, tmp, ncols * sizeof(uint16_t));
        }
    }
}

// The products of up to 16 rows of x with one column group into result tiles 0, 1 (weights through tiles 6, 7; set by
// configure(m, 0) or configure_pair), or with wb also a second group into tiles 2, 3 (weights through 5-7,
// configure_pair only): four chains in flight instead of two. Every element is one chain over K in blocks of 32,
// from zero, either way.
__attribute__((always_inline)) inline void products(const uint16_t* x, int64_t K, const uint16_t* wa,
                                                    const uint16_t* wb) {
    const int64_t blocks = K / kBlockK, lda = K * static_cast<int64_t>(sizeof(uint16_t));
    _tile_zero(0);
    _tile_zero(1);
    if (wb) {
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kb = 0; kb < blocks; ++kb) {
            const uint16_t* a = wa + kb * kPanel;
            const uint16_t* b = wb + kb * kPanel;
            _tile_loadd(4, x + kb * kBlockK, lda);
            _tile_loadd(5, a, 64);
            _tile_loadd(6, a + kPanel / 2, 64);
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(7, b, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, b + kPanel / 2, 64);
            _tile_dpbf16ps(3, 4, 5);
        }
    } else {
        for (int64_t kb = 0; kb < blocks; ++kb) {
            const uint16_t* b = wa + kb * kPanel;
            _tile_loadd(6, b, 64);
            _tile_loadd(7, b + kPanel / 2, 64);
            _tile_loadd(4, x + kb * kBlockK, lda);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
        }
    }
}

// Up to 32 rows of x (m0 <= 16 in the first row tile, m1 <= 16 in the second) times one column group.
void group_rows(const uint16_t* x, int64_t K, int m0, int m1, const uint16_t* wg, uint16_t* out, int64_t N,
                int64_t col) {
    if (!m1) {
        products(x, K, wg, nullptr);
    } else {
        const int64_t blocks = K / kBlockK, lda = K * static_cast<int64_t>(sizeof(uint16_t));
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kb = 0; kb < blocks; ++kb) {
            const uint16_t* b = wg + kb * kPanel;
            _tile_loadd(6, b, 64);
            _tile_loadd(7, b + kPanel / 2, 64);
            _tile_loadd(4, x + kb * kBlockK, lda);
            _tile_loadd(5, x + 16 * K + kb * kBlockK, lda);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    alignas(64) float c[16 * 16];
    const int n0 = N - col >= 16 ? 16 : static_cast<int>(N - col);
    const int n1 = N - col - 16 >= 16 ? 16 : static_cast<int>(N - col - 16);
    _tile_stored(0, c, 64);
    store_rows(c, m0, out + col, N, n0);
    if (n1 > 0) {
        _tile_stored(1, c, 64);
        store_rows(c, m0, out + col + 16, N, n1);
    }
    if (m1) {
        _tile_stored(2, c, 64);
        store_rows(c, m1, out + 16 * N + col, N, n0);
        if (n1 > 0) {
            _tile_stored(3, c, 64);
            store_rows(c, m1, out + 16 * N + col + 16, N, n1);
        }
    }
}

// Up to 16 rows times two column groups at once (the second may be absent): four accumulator tiles in flight
// instead of two, so the tile unit overlaps one group's products with the other's weight loads. Each output
// element is still the one chain over K in blocks of 32 that group_rows computes: the same bits.
// Tiles: 0,1 the first group's results, 2,3 the second's; 4 the x rows; 5,6,7 weights.
void configure_pair(int m) {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
    cfg.rows[0] = cfg.rows[1] = cfg.rows[2] = cfg.rows[3] = cfg.rows[4] = static_cast<uint8_t>(m);
    cfg.rows[5] = cfg.rows[6] = cfg.rows[7] = 16;
    _tile_loadconfig(&cfg);
}

void store_group(int t0, int m, uint16_t* out, int64_t N, int64_t col) {
    alignas(64) float c[16 * 16];
    const int n0 = N - col >= 16 ? 16 : static_cast<int>(N - col);
    const int n1 = N - col - 16 >= 16 ? 16 : static_cast<int>(N - col - 16);
    if (t0 == 0) _tile_stored(0, c, 64);
    else _tile_stored(2, c, 64);
    store_rows(c, m, out + col, N, n0);
    if (n1 > 0) {
        if (t0 == 0) _tile_stored(1, c, 64);
        else _tile_stored(3, c, 64);
        store_rows(c, m, out + col + 16, N, n1);
    }
}

void group_pair_rows(const uint16_t* x, int64_t K, int m, const uint16_t* wa, const uint16_t* wb, uint16_t* out,
                     int64_t N, int64_t col) {
    products(x, K, wa, wb);
    store_group(0, m, out, N, col);
    if (wb) store_group(2, m, out, N, col + kGroupCols);
}

// Running argmax of rows as torch.argmax reads them from the stored bf16 output: the first largest value, NaN
// counting as the largest (its first index).
struct RowBest {
    float value = 0.0f;
    int64_t index = -1;  // -1: nothing seen yet
    int64_t nan = -1;    // first NaN column, -1: none
};

// Rows m of the result tile c (16 columns from col, n valid), rounded to bf16 exactly as store_rows does.
void best_rows(const float* c, int m, int64_t col, int n, RowBest* best) {
    const __mmask16 valid = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
    for (int r = 0; r < m; ++r) {
        const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(c + r * 16)));
        const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        RowBest& b = best[r];
        const __mmask16 nan = _mm512_mask_cmp_ps_mask(valid, v, v, _CMP_UNORD_Q);
        if (nan && b.nan < 0) b.nan = col + __builtin_ctz(nan);
        const float top = _mm512_mask_reduce_max_ps(valid & ~nan, v);
        if (b.index < 0 || top > b.value) {
            const __mmask16 at = _mm512_mask_cmp_ps_mask(valid & ~nan, v, _mm512_set1_ps(top), _CMP_EQ_OQ);
            if (at) {
                b.value = top;
                b.index = col + __builtin_ctz(at);
            }
        }
    }
}

// group_rows' products for up to 16 rows, into the rows' running argmax instead of the output. With wb (a second
// group, configure_pair) two groups go through the tiles together, as in group_pair_rows.
void group_best(const uint16_t* x, int64_t K, int m, const uint16_t* wa, const uint16_t* wb, int64_t N, int64_t col,
                RowBest* best) {
    products(x, K, wa, wb);
    alignas(64) float c[16 * 16];
    for (int grp = 0; grp < (wb ? 2 : 1); ++grp) {
        const int64_t at = col + grp * kGroupCols;
        const int n0 = N - at >= 16 ? 16 : static_cast<int>(N - at);
        const int n1 = N - at - 16 >= 16 ? 16 : static_cast<int>(N - at - 16);
        if (grp == 0) _tile_stored(0, c, 64);
        else _tile_stored(2, c, 64);
        best_rows(c, m, at, n0, best);
        if (n1 > 0) {
            if (grp == 0) _tile_stored(1, c, 64);
            else _tile_stored(3, c, 64);
            best_rows(c, m, at + 16, n1, best);
        }
    }
}
#endif

}  // namespace

extern "C" {

// 1 when this build has the AMX kernel and the kernel may use the tiles (Linux grants the permission per process),
// else 0.
int eagle_trt_amx_available() {
#ifdef EAGLE_TRT_AMX
    return eagle_trt::request_amx() ? 1 : 0;
#else
    return 0;
#endif
}

// w: [K, N] bf16 row-major -> packed: (N rounded up to kGroupCols) * K elements (native_gemm.packed_size).
// Returns -2 if K is not a multiple of 32.
int eagle_trt_amx_pack(const uint16_t* w, uint16_t* packed, int64_t K, int64_t N) {
    if (K <= 0 || K % kBlockK || N <= 0) return -2;
    const int64_t groups = (N + kGroupCols - 1) / kGroupCols, blocks = K / kBlockK;
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t kb = 0; kb < blocks; ++kb)
            for (int t = 0; t < 2; ++t)
                for (int pair = 0; pair < 16; ++pair)
                    for (int n = 0; n < 16; ++n)
                        for (int e = 0; e < 2; ++e) {
                            const int64_t k = kb * kBlockK + 2 * pair + e, col = g * kGroupCols + t * 16 + n;
                            packed[((((g * blocks + kb) * 2 + t) * 16 + pair) * 16 + n) * 2 + e] =
                                col < N ? w[k * N + col] : 0;
                        }
    return 0;
}

// out [M, N] = x [M, K] @ W, bf16, x and out contiguous. Threads split column groups. Returns 0; -2 for a shape it
// does not take; -3 if this build has no AMX kernel.
int eagle_trt_amx_gemm(const uint16_t* x, const uint16_t* packed, uint16_t* out, int64_t M, int64_t K, int64_t N,
                       int threads) {
#ifdef EAGLE_TRT_AMX
    if (K <= 0 || K % kBlockK || N <= 0 || M <= 0) return -2;
    const int64_t groups = (N + kGroupCols - 1) / kGroupCols, blocks = K / kBlockK;
    const int nthreads = threads > 0 ? threads : 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && groups > 1)
    {
        // Tile state is per thread and other libraries in the process (oneDNN) use it too: keep theirs, restore it.
        TileConfig saved;
        _tile_storeconfig(&saved);
        if (M >= kPairRows && M <= 16) {  // most verify passes: two column groups at a time
            configure_pair(static_cast<int>(M));
            const int64_t pairs = (groups + 1) / 2;
#pragma omp for schedule(static)
            for (int64_t pr = 0; pr < pairs; ++pr) {
                const int64_t g = 2 * pr;
                group_pair_rows(x, K, static_cast<int>(M), packed + g * blocks * kPanel,
                                g + 1 < groups ? packed + (g + 1) * blocks * kPanel : nullptr, out, N, g * kGroupCols);
            }
        } else {
            int m0_now = -1, m1_now = -1;
#pragma omp for schedule(static)
            for (int64_t g = 0; g < groups; ++g) {
                const uint16_t* wg = packed + g * blocks * kPanel;
                for (int64_t r = 0; r < M; r += 32) {  // each 32-row chunk re-reads the group from cache, not memory
                    const int64_t left = M - r;
                    const int m0 = left >= 16 ? 16 : static_cast<int>(left);
                    const int m1 = left > 16 ? (left >= 32 ? 16 : static_cast<int>(left - 16)) : 0;
                    if (m0 != m0_now || m1 != m1_now) {
                        configure(m0, m1);
                        m0_now = m0;
                        m1_now = m1;
                    }
                    group_rows(x + r * K, K, m0, m1, wg, out + r * N, N, g * kGroupCols);
                }
            }
        }
        _tile_loadconfig(&saved);  // an all-zero saved state (nothing configured) releases the tiles
    }
    return 0;
#else
    (void)x, (void)packed, (void)out, (void)M, (void)K, (void)N, (void)threads;
    return -3;
#endif
}

// out[r] = argmax over the columns of (x @ W)[r] as eagle_trt_amx_gemm would store it in bf16 (torch.argmax's
// answer on that output), without writing the [M, N] result: for a greedy step, which reads only the argmax of the
// LM head's logits. M <= 16. Threads take contiguous column ranges and merge in column order. Returns 0; -2 for a
// shape it does not take; -3 without the AMX kernel.
int eagle_trt_amx_gemm_argmax(const uint16_t* x, const uint16_t* packed, int64_t* out, int64_t M, int64_t K, int64_t N,
                              int threads) {
#ifdef EAGLE_TRT_AMX
    if (K <= 0 || K % kBlockK || N <= 0 || M <= 0 || M > 16) return -2;
    const int64_t groups = (N + kGroupCols - 1) / kGroupCols, blocks = K / kBlockK;
    const int nthreads = threads > 0 ? (threads < 64 ? threads : 64) : 1;
    RowBest best[64][16];
    int used = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && groups > 1)
    {
        TileConfig saved;
        _tile_storeconfig(&saved);
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int tid = 0, nt = 1;
#endif
        if (tid == 0) used = nt;
        // Contiguous column ranges in thread order, so merging thread by thread keeps the column order.
        const int64_t per = (groups + nt - 1) / nt, g0 = tid * per, g1 = g0 + per < groups ? g0 + per : groups;
        const bool pairs = M >= kPairRows;  // as the projections: two groups at a time from 8 rows
        if (pairs) configure_pair(static_cast<int>(M));
        else configure(static_cast<int>(M), 0);
        for (int64_t g = g0; g < g1; g += pairs ? 2 : 1) {
            const uint16_t* wb = pairs && g + 1 < g1 ? packed + (g + 1) * blocks * kPanel : nullptr;
            group_best(x, K, static_cast<int>(M), packed + g * blocks * kPanel, wb, N, g * kGroupCols, best[tid]);
        }
        _tile_loadconfig(&saved);
    }
    for (int64_t r = 0; r < M; ++r) {
        RowBest all;
        for (int t = 0; t < used; ++t) {
            const RowBest& b = best[t][r];
            if (b.nan >= 0 && all.nan < 0) all.nan = b.nan;
            if (b.index >= 0 && (all.index < 0 || b.value > all.value)) all = RowBest{b.value, b.index, all.nan};
        }
        out[r] = all.nan >= 0 ? all.nan : (all.index >= 0 ? all.index : 0);
    }
    return 0;
#else
    (void)x, (void)packed, (void)out, (void)M, (void)K, (void)N, (void)threads;
    return -3;
#endif
}

}  // extern "C"
