// The int8 block projections on AMX tiles (gemm_int8_amx.cpp): the entry gemm_int8.cpp calls for a many-row call
// on a CPU with AMX-INT8. It computes every integer of int8_blocks.h's formula exactly, as the vector path does, and
// then the same fp32 steps in the same order, so the two paths give the same bits and a call may take either.
#pragma once

#include <cstdint>

#include "amx.h"
#include "int8_blocks.h"

#if defined(EAGLE_TRT_AMX) && defined(__AMX_INT8__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && \
    defined(__AVX512VBMI__)
#define EAGLE_TRT_AMX_INT8 1
#endif

namespace eagle_trt {

// One weight segment of an int8-layout buffer (gemm_int8.cpp reads the header).
struct Int8Segment {
    int64_t format, rows, group_bytes, offset;
};

// The call's quantized activation rows as the tiles read them: row m's int8 codes at a + m * stride, rows padded
// with zero codes to a multiple of 16 (a tile always loads 16 rows).
struct TileRows {
    const int8_t* a;
    int64_t stride;
};

// Whether this build and process can run the tile path (the build targets AMX-INT8 and Linux granted the tiles).
bool int8_amx_ready();

// Group lg of segment s (its first output row n0) for all M rows: out rows [0, M), columns n0 .. n0 + 15 (the valid
// ones). q: the rows' QRow (scales and sums; Q32 or Q256 as the segment's format needs), t: their codes for the
// tiles. The calling thread must have configured the tiles (int8_amx_configure).
template <typename T>
void int8_amx_group(const uint8_t* w, const Int8Segment& s, int64_t lg, int64_t n0, const QRow* q, TileRows t,
                    int64_t M, int64_t K, int64_t N, T* out);

// The calling thread's tile configuration for int8_amx_group on M rows (the thread's previous one saved into the 64
// bytes at saved, to restore with int8_amx_restore when it is done: other libraries in the process use the tiles).
void int8_amx_configure(void* saved, int64_t M);
void int8_amx_restore(const void* saved);

}  // namespace eagle_trt
