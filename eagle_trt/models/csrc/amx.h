// The AMX tile state shared by gemm_amx.cpp and tree_attention.cpp: whether this build targets AMX, the 64-byte
// tile configuration, and the per-process permission Linux wants before the first tile instruction.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define EAGLE_TRT_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace eagle_trt {

struct TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "the tile configuration is 64 bytes");

// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: true once the process may use the tiles (asking again is harmless).
inline bool request_amx() { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }

}  // namespace eagle_trt
#endif
