// Projections y = x @ W on AVX2 + FMA or AVX-512 vectors, for fp32 weights and for bf16-stored weights, with every
// output row a function of that row of x alone.
//
// The invariant: each output element y[m, n] is one chain over k = 0 .. K-1, in order, from +0:
//   fp32 math:  acc = 0;  for k:       acc = fma(W[k, n], x[m, k], acc)
//   bf16 dot:   acc = 0;  for k pairs: acc = dpbf16(acc, W[k..k+1, n], x[m, k..k+1])   (CPUs with AVX512-BF16)
// then y[m, n] = acc, rounded once for a bf16 output. bf16 weights take the dot on CPUs that have it (the bf16 engine
// multiplies bf16 activations, whose products are exact in fp32) and the fp32 math elsewhere.
// Vector lanes hold output columns (one chain per lane), rows are register blocks that share each weight load,
// threads split column panels (never a sum), and a chain paused between chunks of K waits in fp32 memory, which is
// exact. So neither the row count, nor the rows beside a row, nor the blocking, nor the thread count changes a bit,
// and a T-row verify pass gives the bits of T one-row calls (tests/test_native_gemm.py). bf16 values become fp32
// exactly (a 16-bit shift), so bf16 weights stream half the bytes for the same arithmetic.
//
// Layout, packed once at load: panels of kPanel = 2 * kLanes columns, [panel][step][...], zero past N and K. fp32: a
// step is one k, kPanel columns. bf16 fp32-math: one k, its 32-bit word j holding column j in its low half and column
// kLanes + j in its high half, so one load gives both fp32 vectors by a shift and a mask. bf16 dot: a pair of k, two
// vectors of kLanes words (columns 0 .. kLanes-1, then the rest), word j = (W[k, j], W[k+1, j]).
//
// Each weight is read from memory once for up to kSuperRows rows: a panel is walked in chunks of K that stay in the
// L1 cache, and every register block of rows takes its turn on a chunk before the next one is read (prefetched
// meanwhile).

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

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

// Whether bf16 weights take the bf16 dot product (a property of the build: the CPU it targets has AVX512-BF16).
#if defined(__AVX512BF16__) && defined(__AVX512F__)
constexpr bool kHasDot = true;
#else
constexpr bool kHasDot = false;
#endif
template <typename T>
constexpr bool kDot = kHasDot && std::is_same_v<T, uint16_t>;

// Steps of a chain over K (k pairs for the dot), and elements of one panel step.
template <typename T>
constexpr int64_t steps(int64_t K) { return kDot<T> ? (K + 1) / 2 : K; }
template <typename T>
constexpr int64_t kStepElems = kDot<T> ? 2 * kPanel : kPanel;

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

// Cache lines of one panel step: what the loop below asks the memory system for, ahead of time.
template <typename W>
constexpr int kStepLines = kStepElems<W> * sizeof(W) / 64 > 0 ? kStepElems<W> * sizeof(W) / 64 : 1;

// The chains of R rows of x on one panel over steps s0 .. s1-1: a[r] continues from what it holds. x: fp32 values
// (row stride ldx), or for the dot the rows' bf16 pairs as 32-bit words (row stride ldx words). With ahead > 0 each
// step also prefetches the panel step `ahead` steps on (the weights stream from memory; a prefetch changes no
// arithmetic).
template <typename W, int R>
inline void chains(const void* x, int64_t ldx, const W* w, int64_t s0, int64_t s1, vf (&a)[R][2], int64_t ahead) {
    for (int64_t s = s0; s < s1; ++s) {
        const W* row = w + s * kStepElems<W>;
        if (ahead)
            for (int l = 0; l < kStepLines<W>; ++l)
                __builtin_prefetch(reinterpret_cast<const char*>(row + ahead * kStepElems<W>) + 64 * l);
#if defined(__AVX512BF16__) && defined(__AVX512F__)
        if constexpr (kDot<W>) {
            const __m512bh lo = (__m512bh)_mm512_loadu_si512(row), hi = (__m512bh)_mm512_loadu_si512(row + kPanel);
            for (int r = 0; r < R; ++r) {
                const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<const int32_t*>(x)[r * ldx + s]);
                a[r][0] = reinterpret_cast<vf>(_mm512_dpbf16_ps(reinterpret_cast<__m512>(a[r][0]), lo, xb));
                a[r][1] = reinterpret_cast<vf>(_mm512_dpbf16_ps(reinterpret_cast<__m512>(a[r][1]), hi, xb));
            }
            continue;
        }
#endif
        vf lo, hi;
        panel_row(row, lo, hi);
        for (int r = 0; r < R; ++r) {
            const vf xb = vsplat(static_cast<const float*>(x) + r * ldx + s);
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

// R rows (x, out: their first row) on one panel over steps s0 .. s1-1 of `total`. The chains start at 0 when s0 is 0,
// else from `saved` ([R][kPanel] fp32); they end in `out` when s1 is `total`, else in `saved`.
template <typename T, int R>
void rows_on_panel(const void* x, int64_t ldx, const T* panel, int64_t total, int64_t s0, int64_t s1, float* saved,
                   T* out, int64_t N, int64_t n0, int64_t ahead) {
    vf a[R][2];
    for (int r = 0; r < R; ++r) {
        a[r][0] = s0 ? vload(saved + r * kPanel) : vf{};
        a[r][1] = s0 ? vload(saved + r * kPanel + kLanes) : vf{};
    }
    chains<T, R>(x, ldx, panel, s0, s1, a, ahead);
    for (int r = 0; r < R; ++r) {
        if (s1 == total) {
            store_panel(out + r * N, n0, N, a[r][0], a[r][1]);
        } else {
            vstore(saved + r * kPanel, a[r][0]);
            vstore(saved + r * kPanel + kLanes, a[r][1]);
        }
    }
}

template <typename T>
using RowsFn = void (*)(const void*, int64_t, const T*, int64_t, int64_t, int64_t, float*, T*, int64_t, int64_t,
                        int64_t);

template <typename T, size_t... I>
constexpr std::array<RowsFn<T>, sizeof...(I)> rows_table(std::index_sequence<I...>) {
    return {&rows_on_panel<T, static_cast<int>(I) + 1>...};
}

// m rows (1 .. kSuperRows) of x (prepared by `rows_for_math`: row stride ldx), panels p0 .. p1-1: per panel, per
// chunk of K, every register block of rows in turn (the blocks as even as kMaxRows allows). While the first block
// works on a chunk it prefetches the next one, so the weights stream from memory under the arithmetic.
template <typename T>
void many_rows(const void* x, int64_t ldx, int64_t m, const T* packed, int64_t K, int64_t N, int64_t p0, int64_t p1,
               T* out, float* saved) {
    static constexpr auto table = rows_table<T>(std::make_index_sequence<kMaxRows>{});
    const int64_t blocks = (m + kMaxRows - 1) / kMaxRows, base = m / blocks, extra = m % blocks;
    const int64_t total = steps<T>(K), chunk = kChunkK;
    const int64_t xsize = kDot<T> ? 4 : sizeof(float);  // bytes of one step of x
    for (int64_t p = p0; p < p1; ++p) {
        const T* panel = packed + p * total * kStepElems<T>;
        for (int64_t s0 = 0; s0 < total; s0 += chunk) {
            const int64_t s1 = s0 + chunk < total ? s0 + chunk : total;
            for (int64_t b = 0, r0 = 0; b < blocks; ++b) {
                const int64_t rows = base + (b < extra);
                table[rows - 1](static_cast<const char*>(x) + r0 * ldx * xsize, ldx, panel, total, s0, s1,
                                saved + r0 * kPanel, out + r0 * N, N, p * kPanel, b == 0 ? chunk : 0);
                r0 += rows;
            }
        }
    }
}

// Rows r .. r+m-1 of x as the chains read them: fp32 values (an fp32 x itself; bf16 widened into buf), or for the
// dot bf16 pairs (copied into buf with a zero past an odd K). Returns the rows and sets ld, their stride in steps.
template <typename T>
const void* rows_for_math(const T* x, int64_t r, int64_t m, int64_t K, float* buf, int64_t& ld) {
    if constexpr (kDot<T>) {
        ld = steps<T>(K);
        uint16_t* dst = reinterpret_cast<uint16_t*>(buf);
        for (int64_t i = 0; i < m; ++i) {
            std::memcpy(dst + i * 2 * ld, x + (r + i) * K, K * sizeof(uint16_t));
            if (K % 2) dst[i * 2 * ld + K] = 0;
        }
        return dst;
    } else if constexpr (std::is_same_v<T, float>) {
        ld = K;
        return x + r * K;
    } else {
        ld = K;
        for (int64_t i = 0; i < m * K; ++i) buf[i] = Elem<T>::get(x + r * K + i);
        return buf;
    }
}

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
        float* xbuf = std::is_same_v<T, float> ? nullptr : b_x.get(kSuperRows * (K + 1));
        if (!saved || (!std::is_same_v<T, float> && !xbuf)) {
#pragma omp atomic write
            failed = 1;
        } else if (p0 < p1) {
            for (int64_t r = 0; r < M; r += kSuperRows) {
                const int64_t m = M - r < kSuperRows ? M - r : kSuperRows;
                int64_t ld = 0;
                const void* rows = rows_for_math(x, r, m, K, xbuf, ld);
                many_rows(rows, ld, m, packed, K, N, p0, p1, out + r * N, saved);
            }
        }
    }
    return failed ? -1 : 0;
}

#ifdef EAGLE_TRT_MUTATE_GEMM
// Test-only (tests/test_native_mutation.py): the last row of a many-row call sums its two halves of K apart (each
// half a call of its own on x with the other half zeroed), then adds them.
template <typename T>
int mutated_gemm(const T* x, const T* packed, T* out, int64_t M, int64_t K, int64_t N, int threads) {
    if (M == 1 || K < 2) return gemm(x, packed, out, M, K, N, threads);
    if (int rc = gemm(x, packed, out, M - 1, K, N, threads)) return rc;
    std::vector<T> lo(x + (M - 1) * K, x + M * K), hi = lo, ylo(N), yhi(N);
    std::fill(lo.begin() + K / 2, lo.end(), T{});
    std::fill(hi.begin(), hi.begin() + K / 2, T{});
    if (int rc = gemm(lo.data(), packed, ylo.data(), 1, K, N, threads)) return rc;
    if (int rc = gemm(hi.data(), packed, yhi.data(), 1, K, N, threads)) return rc;
    for (int64_t n = 0; n < N; ++n) Elem<T>::put(out + (M - 1) * N + n, Elem<T>::get(&ylo[n]) + Elem<T>::get(&yhi[n]));
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

// Elements of a packed [K, N] weight (fp32, or bf16 with bf16 = 1): N rounded up to whole panels, times the steps.
int64_t eagle_trt_gemm_packed_size(int64_t K, int64_t N, int bf16) {
    const int64_t per_panel = bf16 ? steps<uint16_t>(K) * kStepElems<uint16_t> : K * kPanel;
    return (N + kPanel - 1) / kPanel * per_panel;
}

// w: [K, N] row-major, fp32 or bf16 -> packed (eagle_trt_gemm_packed_size elements of the same type).
int eagle_trt_gemm_pack(const void* w, void* packed, int64_t K, int64_t N, int bf16) {
    if (K <= 0 || N <= 0) return -2;
    const int64_t panels = (N + kPanel - 1) / kPanel;
    if (!bf16) {
        const float* src = static_cast<const float*>(w);
        float* dst = static_cast<float*>(packed);
        for (int64_t p = 0; p < panels; ++p)
            for (int64_t k = 0; k < K; ++k)
                for (int c = 0; c < kPanel; ++c) {
                    const int64_t col = p * kPanel + c;
                    dst[(p * K + k) * kPanel + c] = col < N ? src[k * N + col] : 0.0f;
                }
        return 0;
    }
    const uint16_t* src = static_cast<const uint16_t*>(w);
    uint16_t* dst = static_cast<uint16_t*>(packed);
    const int64_t total = steps<uint16_t>(K);
    for (int64_t p = 0; p < panels; ++p)
        for (int64_t s = 0; s < total; ++s)
            for (int c = 0; c < kPanel; ++c)
                for (int e = 0; e < (kDot<uint16_t> ? 2 : 1); ++e) {
                    const int64_t col = p * kPanel + c, k = kDot<uint16_t> ? 2 * s + e : s;
                    // dot: vector c / kLanes, word c % kLanes, half e; fp32 math: word c % kLanes, half c / kLanes.
                    const int64_t slot = kDot<uint16_t> ? (c / kLanes) * kPanel + 2 * (c % kLanes) + e
                                                        : 2 * (c % kLanes) + c / kLanes;
                    dst[(p * total + s) * kStepElems<uint16_t> + slot] = col < N && k < K ? src[k * N + col] : 0;
                }
    return 0;
}

// out [M, N] = x [M, K] @ W (packed by eagle_trt_gemm_pack), x and out contiguous; all fp32, or all bf16 (bf16 = 1).
int eagle_trt_gemm(const void* x, const void* packed, void* out, int64_t M, int64_t K, int64_t N, int bf16,
                   int threads) {
    if (M <= 0 || K <= 0 || N <= 0) return -2;
    return bf16 ? project<uint16_t>(x, packed, out, M, K, N, threads)
                : project<float>(x, packed, out, M, K, N, threads);
}

}  // extern "C"
