// The int8 block projections' preparation (int8_blocks.h states the layout and the formula): GGUF rows repacked into
// groups of 16 interleaved rows, once at load, and activation rows quantized to int8 blocks, once per call.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "int8_blocks.h"
#include "int8_dot.h"
#include "kernels.h"

namespace eagle_trt {

void int8_quantize_row(const float* x, int64_t K, int block, int8_t* a, float* d, int32_t* s32, int16_t* s16) {
    for (int64_t b0 = 0; b0 < K; b0 += block) {
        float amax = 0.0f;
        for (int64_t k = b0; k < b0 + block; ++k) amax = std::fmax(amax, std::fabs(x[k]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d[b0 / block] = amax / 127.0f;
        for (int64_t k = b0; k < b0 + block; ++k) a[k] = static_cast<int8_t>(std::nearbyint(x[k] * id));
    }
    for (int64_t b0 = 0; b0 < K; b0 += 16) {
        int32_t s = 0;
        for (int64_t k = b0; k < b0 + 16; ++k) s += a[k];
        if (s16) s16[b0 / 16] = static_cast<int16_t>(s);
        if (s32) s32[b0 / 32] = (b0 % 32 ? s32[b0 / 32] : 0) + s;
    }
}

}  // namespace eagle_trt

namespace {

using namespace eagle_trt;

// The 6-bit code of weight k (0 .. 255) of a q6_K block (ggml's dequantize_row_q6_K: ql low/high nibbles, qh pairs).
inline int q6_code(const uint8_t* b, int k) {
    const int h = k / 128, g = (k % 128) / 32, l = k % 32;
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    const int low = g & 1 ? ql[l + 32] : ql[l];
    return ((g < 2 ? low & 0xF : low >> 4) | (((qh[l] >> (2 * g)) & 3) << 4));
}

// One group's block of the weight: rows src[r] (r < valid; the rest padding) -> dst, in the header's layout.
void repack_block(int64_t format, const uint8_t* const* src, int valid, uint8_t* dst) {
    const int64_t bytes = int8_block_bytes(format);
    std::memset(dst, 0, bytes);
    if (format == kQ8_0) std::memset(dst + 32, 0x80, 512);  // padding rows' codes: w = 0
    for (int r = 0; r < valid; ++r) {
        const uint8_t* b = src[r];
        if (format == kQ8_0 || format == kQ4_0) {
            std::memcpy(dst + 2 * r, b, 2);
            for (int j = 0; j < (format == kQ8_0 ? 8 : 4); ++j)
                for (int t = 0; t < 4; ++t) {
                    const uint8_t q = b[2 + 4 * j + t];
                    dst[32 + 64 * j + 4 * r + t] = format == kQ8_0 ? static_cast<uint8_t>(q ^ 0x80) : q;
                }
        } else if (format == kQ4_1) {
            std::memcpy(dst + 2 * r, b, 2);
            std::memcpy(dst + 32 + 2 * r, b + 2, 2);
            for (int j = 0; j < 4; ++j) std::memcpy(dst + 64 + 64 * j + 4 * r, b + 4 + 4 * j, 4);
        } else if (format == kQ5_0) {
            std::memcpy(dst + 2 * r, b, 2);
            uint32_t qh;
            std::memcpy(&qh, b + 2, 4);
            for (int j = 0; j < 4; ++j)
                for (int t = 0; t < 4; ++t) {
                    dst[32 + 64 * j + 4 * r + t] = b[6 + 4 * j + t];
                    dst[288 + 4 * r + t] |= static_cast<uint8_t>((((qh >> (4 * j + t)) & 1) << j) |
                                                                 (((qh >> (16 + 4 * j + t)) & 1) << (4 + j)));
                }
        } else if (format == kQ4_K) {
            std::memcpy(dst + 2 * r, b, 2);
            std::memcpy(dst + 32 + 2 * r, b + 2, 2);
            for (int s = 0; s < 8; ++s) {
                int sc, m;
                scale_min_k4(s, b + 4, sc, m);
                dst[64 + 16 * s + r] = static_cast<uint8_t>(sc);
                dst[192 + 32 * (s / 2) + 2 * r + s % 2] = static_cast<uint8_t>(m);
            }
            for (int c = 0; c < 4; ++c)
                for (int j = 0; j < 8; ++j) std::memcpy(dst + 320 + 512 * c + 64 * j + 4 * r, b + 16 + 32 * c + 4 * j, 4);
        } else {  // q6_K
            std::memcpy(dst + 2 * r, b + 208, 2);
            for (int s = 0; s < 16; ++s) dst[32 + 16 * s + r] = b[192 + s];
            for (int c = 0; c < 8; ++c) {
                uint8_t* ch = dst + 288 + 384 * c;
                for (int j = 0; j < 4; ++j)
                    for (int t = 0; t < 4; ++t) {
                        const int q0 = q6_code(b, 32 * c + 4 * j + t), q1 = q6_code(b, 32 * c + 16 + 4 * j + t);
                        ch[64 * j + 4 * r + t] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
                        ch[256 + 4 * r + t] |= static_cast<uint8_t>((q0 >> 4) << (2 * j));
                        ch[320 + 4 * r + t] |= static_cast<uint8_t>((q1 >> 4) << (2 * j));
                    }
            }
        }
    }
}

}  // namespace

extern "C" {

// Bytes of one 16-row group of K weights in the int8 layout, or -2 for a format without it or a K not whole blocks.
int64_t eagle_trt_int8_group_bytes(int64_t format, int64_t K) {
    const int64_t b = int8_group_bytes(format, K);
    return b < 0 ? -2 : b;
}

// rows GGUF rows of K weights (src, block_row_bytes apart) -> ceil(rows / 16) groups at dst.
int eagle_trt_int8_repack(int64_t format, const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst) {
    const int64_t gb = int8_group_bytes(format, K), rb = block_row_bytes(format, K);
    if (gb < 0 || rb < 0 || rows <= 0) return -2;
    const BlockShape s = block_shape(format);
    const int64_t blocks = K / s.elems, bb = int8_block_bytes(format);
    for (int64_t g = 0; g * kGroup < rows; ++g) {
        const int valid = static_cast<int>(rows - g * kGroup < kGroup ? rows - g * kGroup : kGroup);
        for (int64_t b = 0; b < blocks; ++b) {
            const uint8_t* at[kGroup];
            for (int r = 0; r < valid; ++r) at[r] = src + (g * kGroup + r) * rb + b * s.bytes;
            repack_block(format, at, valid, dst + g * gb + b * bb);
        }
    }
    return 0;
}

// x [M, K] fp32 -> a [M, K] int8 and d [M, K / block] (block 32 or 256): the activation quantizer, for tests.
int eagle_trt_int8_quantize(const float* x, int64_t M, int64_t K, int64_t block, int8_t* a, float* d) {
    if ((block != 32 && block != 256) || K <= 0 || K % block) return -2;
    for (int64_t m = 0; m < M; ++m)
        int8_quantize_row(x + m * K, K, static_cast<int>(block), a + m * K, d + m * (K / block), nullptr, nullptr);
    return 0;
}

// Which integer dot product this build's int8 projections use (int8_dot.h): 3 AVX512-VNNI, 2 AVX-VNNI, 1 AVX2, 0
// scalar.
int eagle_trt_int8_dot(void) { return kInt8Dot; }

}  // extern "C"
