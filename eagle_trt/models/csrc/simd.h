// Fixed-width vector helpers for the kernels: GCC vector types, exact fused multiply-add on every path, a
// polynomial exp, bf16 loads and rounding, and cross-lane sums in a fixed order. Everything here is lane-wise or has
// an order fixed by the lane count alone, so a result never depends on where in a buffer or in which call it was
// computed.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

namespace eagle_trt {

// A growable 64-byte-aligned buffer kept per thread across calls: the decode loop calls the kernels hundreds of
// times a token, and OpenMP's pool threads live as long as the process, so after the first calls nothing is
// allocated.
struct Buffer {
    void* p = nullptr;
    size_t bytes = 0;
    template <typename T = float>
    T* get(size_t count) {
        const size_t need = (count * sizeof(T) + 63) / 64 * 64;
        if (need > bytes) {
            std::free(p);
            p = std::aligned_alloc(64, need);
            bytes = p ? need : 0;
        }
        return static_cast<T*>(p);
    }
    ~Buffer() { std::free(p); }
};

// One vector register: 16 floats with AVX-512, else 8 (AVX2 and anything else). The lane count fixes the order of
// the few cross-lane sums, so it is a property of the build, the same for every call in a process.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline float bf16_to_float(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// The bf16 bits of fp32 bits u, rounded to nearest even (a NaN becomes the quiet NaN), as torch rounds: for one
// value (uint32_t) or every lane (vu32) alike.
template <typename U>
inline U bf16_bits(U u) {
    return (u & 0x7fffffffu) > 0x7f800000u ? U{} + 0x7fc0u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// fp32 -> bf16.
inline uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return static_cast<uint16_t>(bf16_bits(u));
}

inline float lane_sum(vf a) {
    // Fixed pairwise tree over the lanes.
    float t[kLanes];
    for (int l = 0; l < kLanes; ++l) t[l] = a[l];
    for (int width = kLanes / 2; width > 0; width /= 2)
        for (int l = 0; l < width; ++l) t[l] = t[l] + t[l + width];
    return t[0];
}

// fold<W>(x, y): in blocks of 2W lanes, each block's low half plus its high half, x's blocks then y's. One level of
// lane_sum's tree (t[l] + t[l + W]) applied to two vectors at once.
template <int W>
inline vf fold(vf x, vf y) {
    constexpr int nb = kLanes / (2 * W);
    vi lo, hi;
    for (int b = 0; b < nb; ++b)
        for (int l = 0; l < W; ++l) {
            lo[b * W + l] = b * 2 * W + l;
            lo[(nb + b) * W + l] = kLanes + b * 2 * W + l;
            hi[b * W + l] = b * 2 * W + W + l;
            hi[(nb + b) * W + l] = kLanes + b * 2 * W + W + l;
        }
    return __builtin_shuffle(x, y, lo) + __builtin_shuffle(x, y, hi);
}

template <int W>
inline void fold_all(vf* a, int n) {
    for (int i = 0; i < n / 2; ++i) a[i] = fold<W>(a[2 * i], a[2 * i + 1]);
    if constexpr (W > 1) fold_all<W / 2>(a, n / 2);
}

// lane_sum of kLanes vectors at once: lane j of the result is lane_sum(a[j]), bit for bit (the same pairwise tree
// over the lanes), for every j. Overwrites a.
inline vf lane_sums(vf* a) {
    fold_all<kLanes / 2>(a, kLanes);
    return a[0];
}

inline vf vload(const float* p) {
    vf r;
    std::memcpy(&r, p, sizeof r);
    return r;
}

inline void vstore(float* p, vf a) { std::memcpy(p, &a, sizeof a); }

// a * b + c rounded once, in every lane. Every branch computes the same exact fused multiply-add (fmaf is exact
// by definition), so results do not depend on which one the compiler takes.
inline vf vfma(vf a, vf b, vf c) {
#if defined(__AVX512F__)
    return reinterpret_cast<vf>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                                reinterpret_cast<__m512>(c)));
#elif defined(__FMA__)
    return reinterpret_cast<vf>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                                reinterpret_cast<__m256>(c)));
#else
    vf r;
    for (int l = 0; l < kLanes; ++l) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return r;
#endif
}

inline vf vfma(vf a, float b, vf c) { return vfma(a, vf{} + b, c); }

// b on every lane, loaded straight from memory: the same lanes as vf{} + b for any b but -0.0 (which the sum turns
// into +0.0). For non-negative weights, as the attention's softmax weights are, it is the same vector without the add.
inline vf vsplat(const float* b) {
#if defined(__AVX512F__)
    return reinterpret_cast<vf>(_mm512_set1_ps(*b));
#elif defined(__AVX__)
    return reinterpret_cast<vf>(_mm256_set1_ps(*b));
#else
    return vf{} + *b;
#endif
}

// exp(x) for x <= 0 (scores minus their max): range reduction by ln 2 and a degree-6 polynomial, about 1e-7
// relative error. Inputs below -87 give exp(-87) (~1.6e-38), which adds nothing visible to a sum that holds 1.
inline vf vexp(vf x) {
    const vf lo = vf{} - 87.0f;
    x = x < lo ? lo : x;
    const vf log2e = vf{} + 1.44269504088896341f;
    // n = x * log2e rounded to the nearest integer: adding and subtracting 1.5 * 2^23 leaves the integer part
    // (exact for |n| < 2^22; here -126 <= n <= 0), with no per-lane call.
    const vf magic = vf{} + 12582912.0f;
    const vf n = (x * log2e + magic) - magic;
    const vf r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    vf p = vf{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    vf scale;
    std::memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

typedef uint16_t vu16 __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t vu32 __attribute__((vector_size(kLanes * sizeof(uint32_t))));

// kLanes bf16 values -> fp32 (exact: a bf16 is the high half of an fp32).
inline vf vload_bf16(const uint16_t* p) {
    // One widening load and a shift (a generic vector conversion compiles to six instructions on AVX2).
#if defined(__AVX512F__)
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return reinterpret_cast<vf>(_mm512_slli_epi32(w, 16));
#elif defined(__AVX2__)
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return reinterpret_cast<vf>(_mm256_slli_epi32(w, 16));
#endif
    vu16 h;
    std::memcpy(&h, p, sizeof h);
    const vu32 u = __builtin_convertvector(h, vu32) << 16;
    vf r;
    std::memcpy(&r, &u, sizeof r);
    return r;
}

// to_bf16 on every lane.
inline vu32 vround_bits(vf f) {
    vu32 u;
    std::memcpy(&u, &f, sizeof u);
    return bf16_bits(u);
}

inline void vstore_bf16(uint16_t* p, vf f) {
    // The rounded bits fit 16 bits, so narrowing is exact: one instruction on AVX-512, a saturating pack on AVX2.
#if defined(__AVX512F__)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(reinterpret_cast<__m512i>(vround_bits(f))));
    return;
#elif defined(__AVX2__)
    const __m256i u = reinterpret_cast<__m256i>(vround_bits(f));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
    return;
#endif
    const vu16 h = __builtin_convertvector(vround_bits(f), vu16);
    std::memcpy(p, &h, sizeof h);
}

// f rounded to bf16 and back, on every lane (what storing a bf16 tensor and reading it again gives).
inline vf vround_bf16(vf f) {
    const vu32 u = vround_bits(f) << 16;
    vf r;
    std::memcpy(&r, &u, sizeof r);
    return r;
}

// Activations of either engine dtype through one code path: `float` (fp32 tensors) or `uint16_t` (bf16 bits).
// load/store convert to and from fp32 (exact for bf16 loads; stores round to nearest even), and round() is what
// storing a value in T and reading it back gives: the identity for fp32, the bf16 rounding torch's bf16 operators
// apply after every operation. An fp32 kernel is thus its bf16 twin with every rounding step taken out.
template <typename T>
struct Elem;

template <>
struct Elem<float> {
    static float get(const float* p) { return *p; }
    static void put(float* p, float f) { *p = f; }
    static float round(float f) { return f; }
    static vf load(const float* p) { return vload(p); }
    static void store(float* p, vf f) { vstore(p, f); }
    static vf round(vf f) { return f; }
};

template <>
struct Elem<uint16_t> {
    static float get(const uint16_t* p) { return bf16_to_float(*p); }
    static void put(uint16_t* p, float f) { *p = to_bf16(f); }
    static float round(float f) { return bf16_to_float(to_bf16(f)); }
    static vf load(const uint16_t* p) { return vload_bf16(p); }
    static void store(uint16_t* p, vf f) { vstore_bf16(p, f); }
    static vf round(vf f) { return vround_bf16(f); }
};

// Converts n elements (fp32 or bf16) to fp32.
inline void to_float(const void* base, int64_t offset, int bf16, int n, float* dst) {
    if (!bf16) {
        std::memcpy(dst, static_cast<const float*>(base) + offset, sizeof(float) * n);
        return;
    }
    const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) vstore(dst + i, vload_bf16(src + i));
    for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// Largest of s[0..n) (max is exact, so the order does not matter).
inline float max_of(const float* s, int n) {
    float m = s[0];
    int i = 0;
    if (n >= kLanes) {
        vf mv = vload(s);
        for (i = kLanes; i + kLanes <= n; i += kLanes) {
            const vf x = vload(s + i);
            mv = x > mv ? x : mv;
        }
        for (int l = 0; l < kLanes; ++l) m = mv[l] > m ? mv[l] : m;
    }
    for (; i < n; ++i) m = s[i] > m ? s[i] : m;
    return m;
}

}  // namespace eagle_trt
