// Projections y = x @ W on AVX2 + FMA or AVX-512 vectors, for fp32 weights and for bf16-stored weights computed in
// fp32, with every output row a function of that row of x alone.
//
// The invariant: each output element y[m, n] is one chain of fused multiply-adds over k = 0 .. K-1, in order, from
// +0:   acc = 0;  for k: acc = fma(W[k, n], x[m, k], acc);   y[m, n] = acc (rounded once for a bf16 output).
// Vector lanes hold output columns (one chain per lane), rows are register blocks that share each weight load,
// threads split column panels (never a sum), and a chain paused between chunks of K waits in fp32 memory, which is
// exact. So neither the row count, nor the rows beside a row, nor the blocking, nor the thread count changes a bit,
// and a T-row verify pass gives the bits of T one-row calls (tests/test_native_gemm.py). bf16 values become fp32
// exactly (a 16-bit shift), so bf16 weights stream half the bytes for the same arithmetic.
//
// Layout, packed once at load: panels of kPanel = 2 * kLanes columns, [panel][K][kPanel], zero past N. A bf16 panel
// row interleaves its two halves: 32-bit word j holds column j in its low half and column kLanes + j in its high
// half, so one load gives both fp32 vectors by a shift and a mask.
//
// Each weight is read from memory once for up to kSuperRows rows: a panel is walked in chunks of K that stay in the
// L1 cache, and every register block of rows takes its turn on a chunk before the next one is read (prefetched
// meanwhile).

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels.h"
#include "simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using namespace eagle_trt;

constexpr int kPanel = 2 * kLanes;
#if defined(__AVX512F__)
constexpr int kMaxRows = 12;      // 24 accumulators, 2 weight vectors and a broadcast of 32 registers
constexpr int64_t kChunkK = 128;  // a chunk of fp32 panel rows: 16 KB
#else
constexpr int kMaxRows = 6;       // 12 accumulators, 2 weight vectors and a broadcast of 16 registers
constexpr int64_t kChunkK = 256;  // 16 KB
#endif
constexpr int64_t kSuperRows = 64;  // rows that share one pass over the weights

// Panel row of a packed weight -> its two fp32 vectors (columns 0 .. kLanes-1 and kLanes .. kPanel-1).
inline void panel_row(const float* p, vf& lo, vf& hi) {
    lo = vload(p);
    hi = vload(p + kLanes);
}

inline void panel_row(const uint16_t* p, vf& lo, vf& hi) {
    vu32 u;
    std::memcpy(&u, p, sizeof u);
    const vu32 a = u << 16, b = u & 0xffff0000u;
    std::memcpy(&lo, &a, sizeof lo);
    std::memcpy(&hi, &b, sizeof hi);
}

// Cache lines of one panel row: what the loop below asks the memory system for, ahead of time.
template <typename W>
constexpr int kRowLines = kPanel * sizeof(W) / 64 > 0 ? kPanel * sizeof(W) / 64 : 1;

// The chains of R rows of x (fp32, row stride ldx) on one panel over k0 .. k1-1: a[r] continues from what it holds.
// With ahead > 0 each step also prefetches the panel row `ahead` rows on (the weights stream from memory; a prefetch
// changes no arithmetic).
template <typename W, int R>
inline void chains(const float* x, int64_t ldx, const W* w, int64_t k0, int64_t k1, vf (&a)[R][2], int64_t ahead) {
    for (int64_t k = k0; k < k1; ++k) {
        if (ahead)
            for (int l = 0; l < kRowLines<W>; ++l)
                __builtin_prefetch(reinterpret_cast<const char*>(w + (k + ahead) * kPanel) + 64 * l);
        vf lo, hi;
        panel_row(w + k * kPanel, lo, hi);
        for (int r = 0; r < R; ++r) {
            const vf xb = vsplat(x + r * ldx + k);
            a[r][0] = vfma(lo, xb, a[r][0]);
            a[r][1] = vfma(hi, xb, a[r][1]);
        }
    }
}

// One output row's columns n0 .. n0 + kPanel - 1 (those below N).
template <typename T>
inline void store_panel(T* out, int64_t n0, int64_t N, vf lo, vf hi) {
    if (n0 + kPanel <= N) {
        Elem<T>::store(out + n0, lo);
        Elem<T>::store(out + n0 + kLanes, hi);
        return;
    }
    float t[kPanel];
    vstore(t, lo);
    vstore(t + kLanes, hi);
    for (int64_t c = 0; c < N - n0; ++c) Elem<T>::put(out + n0 + c, t[c]);
}

// R rows (x, out: their first row) on one panel over k0 .. k1-1. The chains start at 0 when k0 is 0, else from
// `saved` ([R][kPanel] fp32); they end in `out` when k1 is K, else in `saved`.
template <typename T, int R>
void rows_on_panel(const float* x, const T* panel, int64_t K, int64_t k0, int64_t k1, float* saved, T* out,
                   int64_t N, int64_t n0, int64_t ahead) {
    vf a[R][2];
    for (int r = 0; r < R; ++r) {
        a[r][0] = k0 ? vload(saved + r * kPanel) : vf{};
        a[r][1] = k0 ? vload(saved + r * kPanel + kLanes) : vf{};
    }
    chains<T, R>(x, K, panel, k0, k1, a, ahead);
    for (int r = 0; r < R; ++r) {
        if (k1 == K) {
            store_panel(out + r * N, n0, N, a[r][0], a[r][1]);
        } else {
            vstore(saved + r * kPanel, a[r][0]);
            vstore(saved + r * kPanel + kLanes, a[r][1]);
        }
    }
}

template <typename T>
using RowsFn = void (*)(const float*, const T*, int64_t, int64_t, int64_t, float*, T*, int64_t, int64_t, int64_t);

template <typename T, size_t... I>
constexpr std::array<RowsFn<T>, sizeof...(I)> rows_table(std::index_sequence<I...>) {
    return {&rows_on_panel<T, static_cast<int>(I) + 1>...};
}

// m rows (1 .. kSuperRows), panels p0 .. p1-1: per panel, per chunk of K, every register block of rows in turn (the
// blocks as even as kMaxRows allows). While the first block works on a chunk it prefetches the next one, so the
// weights stream from memory under the arithmetic instead of between it.
template <typename T>
void many_rows(const float* x, int64_t m, const T* packed, int64_t K, int64_t N, int64_t p0, int64_t p1, T* out,
               float* saved) {
    static constexpr auto table = rows_table<T>(std::make_index_sequence<kMaxRows>{});
    const int64_t blocks = (m + kMaxRows - 1) / kMaxRows, base = m / blocks, extra = m % blocks;
    const int64_t chunk = kChunkK;
    for (int64_t p = p0; p < p1; ++p) {
        const T* panel = packed + p * K * kPanel;
        for (int64_t k0 = 0; k0 < K; k0 += chunk) {
            const int64_t k1 = k0 + chunk < K ? k0 + chunk : K;
            for (int64_t b = 0, r0 = 0; b < blocks; ++b) {
                const int64_t rows = base + (b < extra);
                const int64_t ahead = b == 0 ? chunk : 0;
                table[rows - 1](x + r0 * K, panel, K, k0, k1, saved + r0 * kPanel, out + r0 * N, N, p * kPanel, ahead);
                r0 += rows;
            }
        }
    }
}

// A growable 64-byte-aligned buffer kept per thread across calls (the decode loop makes hundreds of calls a token).
struct Buffer {
    float* p = nullptr;
    size_t count = 0;
    float* get(size_t n) {
        if (n > count) {
            std::free(p);
            p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
            count = p ? n : 0;
        }
        return p;
    }
    ~Buffer() { std::free(p); }
};

template <typename T>
int gemm(const T* x, const T* packed, T* out, int64_t M, int64_t K, int64_t N, int threads) {
    const int64_t panels = (N + kPanel - 1) / kPanel;
    const int nthreads = threads > 0 ? threads : 1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && panels > 1)
    {
        static thread_local Buffer b_x, b_saved;
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int tid = 0, nt = 1;
#endif
        // Contiguous panel ranges, one per thread.
        const int64_t per = (panels + nt - 1) / nt, p0 = tid * per, p1 = p0 + per < panels ? p0 + per : panels;
        float* saved = b_saved.get(kSuperRows * kPanel);
        float* xf = sizeof(T) == sizeof(float) ? nullptr : b_x.get(kSuperRows * K);
        if (!saved || (sizeof(T) != sizeof(float) && !xf)) {
#pragma omp atomic write
            failed = 1;
        } else if (p0 < p1) {
            for (int64_t r = 0; r < M; r += kSuperRows) {
                const int64_t m = M - r < kSuperRows ? M - r : kSuperRows;
                const float* xr;
                if constexpr (sizeof(T) == sizeof(float)) {
                    xr = reinterpret_cast<const float*>(x) + r * K;
                } else {
                    for (int64_t i = 0; i < m * K; ++i) xf[i] = Elem<T>::get(x + r * K + i);
                    xr = xf;
                }
                many_rows(xr, m, packed, K, N, p0, p1, out + r * N, saved);
            }
        }
    }
    return failed ? -1 : 0;
}

#ifdef EAGLE_TRT_MUTATE_GEMM
// Test-only (tests/test_native_mutation.py): the last row of a many-row call sums its two halves of K apart.
template <typename T>
int mutated_gemm(const T* x, const T* packed, T* out, int64_t M, int64_t K, int64_t N, int threads) {
    if (M == 1 || K < 2) return gemm(x, packed, out, M, K, N, threads);
    if (int rc = gemm(x, packed, out, M - 1, K, N, threads)) return rc;
    float xf[8192];
    if (K > 8192) return -2;
    for (int64_t k = 0; k < K; ++k) xf[k] = Elem<T>::get(x + (M - 1) * K + k);
    for (int64_t p = 0; p < (N + kPanel - 1) / kPanel; ++p) {
        vf a[1][2] = {}, b[1][2] = {};
        chains<T, 1>(xf, K, packed + p * K * kPanel, 0, K / 2, a, 0);
        chains<T, 1>(xf, K, packed + p * K * kPanel, K / 2, K, b, 0);
        store_panel(out + (M - 1) * N, p * kPanel, N, a[0][0] + b[0][0], a[0][1] + b[0][1]);
    }
    return 0;
}
#endif

template <typename T>
int project(const void* x, const void* packed, void* out, int64_t M, int64_t K, int64_t N, int threads) {
#ifdef EAGLE_TRT_MUTATE_GEMM
    return mutated_gemm(static_cast<const T*>(x), static_cast<const T*>(packed), static_cast<T*>(out), M, K, N,
                        threads);
#else
    return gemm(static_cast<const T*>(x), static_cast<const T*>(packed), static_cast<T*>(out), M, K, N, threads);
#endif
}

}  // namespace

extern "C" {

int eagle_trt_isa(void) {
    if (eagle_trt_amx_available()) return 3;
#if defined(__AVX512F__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

int eagle_trt_lanes(void) { return kLanes; }

// Elements of a packed [K, N] weight: N rounded up to whole panels, times K.
int64_t eagle_trt_gemm_packed_size(int64_t K, int64_t N) { return (N + kPanel - 1) / kPanel * kPanel * K; }

// w: [K, N] row-major, fp32 or bf16 -> packed (eagle_trt_gemm_packed_size elements of the same type).
int eagle_trt_gemm_pack(const void* w, void* packed, int64_t K, int64_t N, int bf16) {
    if (K <= 0 || N <= 0) return -2;
    const int64_t panels = (N + kPanel - 1) / kPanel;
    for (int64_t p = 0; p < panels; ++p)
        for (int64_t k = 0; k < K; ++k)
            for (int c = 0; c < kPanel; ++c) {
                const int64_t col = p * kPanel + c, at = (p * K + k) * kPanel;
                if (bf16) {
                    const int slot = c < kLanes ? 2 * c : 2 * (c - kLanes) + 1;
                    static_cast<uint16_t*>(packed)[at + slot] =
                        col < N ? static_cast<const uint16_t*>(w)[k * N + col] : 0;
                } else {
                    static_cast<float*>(packed)[at + c] = col < N ? static_cast<const float*>(w)[k * N + col] : 0.0f;
                }
            }
    return 0;
}

// out [M, N] = x [M, K] @ W (packed by eagle_trt_gemm_pack), x and out contiguous; all fp32, or all bf16 (bf16 = 1).
int eagle_trt_gemm(const void* x, const void* packed, void* out, int64_t M, int64_t K, int64_t N, int bf16,
                   int threads) {
    if (M <= 0 || K <= 0 || N <= 0) return -2;
    return bf16 ? project<uint16_t>(x, packed, out, M, K, N, threads) : project<float>(x, packed, out, M, K, N, threads);
}

}  // extern "C"
