// The machine's multiply-add peak as the kernels reach it: independent chains of the instructions the projections
// compute with (simd.h's fp32 fused multiply-add, the AVX512-BF16 dot where the build has it, the integer dot of
// int8_dot.h for this ISA), on `threads` threads at once, in registers of the build's native width.
// scripts/kernel_timings.py --parts sets each part's time against it: the floor of a many-row verify pass here,
// beside the memory floor of a one-row one.

#include <chrono>
#include <cstdint>

#include "kernels.h"
#include "simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using namespace eagle_trt;

// Independent accumulators: more than the latency x throughput of any of these instructions, all in registers.
constexpr int kChains = 12;
constexpr int64_t kIters = 1 << 19;  // per timing: kChains * kIters instructions, a few ms

// acc + the 4-byte dots of u (unsigned bytes) and the quad q (signed, in every lane): int8_dot.h's instructions at
// the build's native width (its dot4 works on 16 lanes, two registers on AVX2, which 12 chains would spill: the
// timing would then be of the spills).
inline vi int8_dot(vi acc, vi u, int32_t q) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return reinterpret_cast<vi>(_mm512_dpbusd_epi32(reinterpret_cast<__m512i>(acc), reinterpret_cast<__m512i>(u),
                                                    _mm512_set1_epi32(q)));
#elif defined(__AVXVNNI__) && !defined(__AVX512F__)
    return reinterpret_cast<vi>(_mm256_dpbusd_avx_epi32(reinterpret_cast<__m256i>(acc), reinterpret_cast<__m256i>(u),
                                                        _mm256_set1_epi32(q)));
#elif defined(__AVX512BW__)
    const __m512i p = _mm512_maddubs_epi16(reinterpret_cast<__m512i>(u), _mm512_set1_epi32(q));
    return acc + reinterpret_cast<vi>(_mm512_madd_epi16(p, _mm512_set1_epi16(1)));
#elif defined(__AVX2__)
    const __m256i p = _mm256_maddubs_epi16(reinterpret_cast<__m256i>(u), _mm256_set1_epi32(q));
    return acc + reinterpret_cast<vi>(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#else
    vi r = acc;
    for (int l = 0; l < kLanes; ++l)
        for (int t = 0; t < 4; ++t)
            r[l] += static_cast<int32_t>((u[l] >> (8 * t)) & 0xFF) * static_cast<int8_t>((q >> (8 * t)) & 0xFF);
    return r;
#endif
}

// Seconds of one timing of Kind's chains on this thread (the results folded into sink so none is dropped).
template <int Kind>
double time_chains(float* sink) {
    vf f[kChains];
    vi n[kChains], u[kChains];
    for (int c = 0; c < kChains; ++c) {  // distinct starts and bytes: no two chains are the same computation
        f[c] = vf{} + static_cast<float>(c);
        n[c] = vi{} + c;
        u[c] = vi{} + (0x01020304 + c);
    }
    const vf a = vf{} + 1.0001f, b = vf{} + 0.9999f;
    int32_t q = 0x05060708;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kIters; ++i) {
        // q opaque each time: an int8 dot of several instructions (AVX2) cannot have its products hoisted out of the
        // loop (the fp32 and bf16 chains depend on their accumulators anyway).
        asm volatile("" : "+r"(q));
        for (int c = 0; c < kChains; ++c) {
            if constexpr (Kind == 0) {
                f[c] = vfma(a, b, f[c]);
            } else if constexpr (Kind == 1) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
                const __m512 r = _mm512_dpbf16_ps(reinterpret_cast<const __m512&>(f[c]),
                                                  reinterpret_cast<const __m512bh&>(a),
                                                  reinterpret_cast<const __m512bh&>(b));
                f[c] = reinterpret_cast<const vf&>(r);
#endif
            } else {
                n[c] = int8_dot(n[c], u[c], q);
            }
        }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float acc = 0;
    for (int c = 0; c < kChains; ++c)
        for (int l = 0; l < kLanes; ++l) acc += f[c][l] + static_cast<float>(n[c][l]);
    *sink += acc;
    return s;
}

volatile float g_sink;  // where every timing's results end up, so the compiler keeps their chains

// Multiply-adds of one instruction (group) per lane: fp32 1, bf16 dot 2 (a pair), int8 dot 4 (a quad).
constexpr double kPerLane[3] = {1, 2, 4};

}  // namespace

extern "C" {

// G multiply-adds per second of kind (0 fp32 fma, 1 bf16 dot, 2 int8 dot) over `threads` threads running at once:
// the sum over threads of each one's best of `reps` timings. -1 where this build has no such instruction (bf16 dot
// without AVX512-BF16: bf16 weights then compute in fp32, kind 0) or for a bad argument.
float eagle_trt_madd_peak(int kind, int threads, int reps) {
#if !(defined(__AVX512BF16__) && defined(__AVX512F__))
    if (kind == 1) return -1.0f;
#endif
    if (kind < 0 || kind > 2 || reps < 1) return -1.0f;
    const int nthreads = threads > 0 ? threads : 1;
    double total = 0;
    float sink = 0;
#pragma omp parallel num_threads(nthreads) reduction(+ : total, sink)
    {
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
            const double s = kind == 0 ? time_chains<0>(&sink) : kind == 1 ? time_chains<1>(&sink)
                                                                             : time_chains<2>(&sink);
            best = s < best ? s : best;
        }
        total += kPerLane[kind] * kLanes * kChains * static_cast<double>(kIters) / best;
    }
    g_sink = sink;
    return static_cast<float>(total / 1e9);
}

}  // extern "C"
