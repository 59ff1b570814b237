// Masked attention whose every output row is a function of that row's query and of its visible keys, taken in
// slot order, and of nothing else: not the number of query rows in the call, not where hidden keys sit.
//
// Why: speculative verification scores T tree tokens in one forward, and greedy decoding must give the same
// bits as scoring each of them alone (T = 1) after its ancestors were committed. A BLAS or fused attention
// kernel picks its blocking, lanes and threads from the call's shape, so a row's sums run in a different order
// in the two calls. Here every sum has an order fixed by the row and its keys alone:
//   1. scores: the score of (query vector, key) is, in each lane l, a chain of fused multiply-adds over the
//      elements l, l + kLanes, ... of head_dim, in order, then lane_sum's fixed tree over the lanes (lane_sums does
//      a whole block of keys at once with the same tree per key), whichever block the key lands in. A head_dim that
//      is not a whole number of vectors takes K transposed once per call instead, each score one lane's chain over
//      head_dim in order (the path is fixed by the model's head_dim). With bf16 inputs on a CPU
//      that grants AMX tiles, K is packed into tiles instead and each score is the tile instruction's dot product
//      over head_dim (blocks of 32 in order): it treats each (query, key) element of a tile apart, so the score
//      is again a function of that query and key alone. Which path runs is fixed per process;
//   2. the visible keys are listed in slot order (prefix, then the row's ancestors, then itself: the same
//      sequence, in the same order, as the keys slots 0..p hold when that token is decoded alone);
//   3. softmax over that list: max (exact in any order), exp by a fixed polynomial, the sum in fixed-width lane
//      chunks and a fixed lane tree (the order depends on the list's length only);
//   4. output: sum over the listed keys in order, one lane per element of head_dim.
// Compiled with -ffp-contract=off, with explicit fused multiply-adds (simd.h, vfma) where the sums are: no
// multiply-add is fused in one place and left apart in another. Threads split tasks (a few query rows of one KV
// head), never a row, so the thread count changes no bit either.
//
// The Python side (eagle_trt/models/native/) compiles this file with the machine's C++ compiler on first use and
// calls it through ctypes.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels.h"
#include "simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "amx.h"
#ifdef EAGLE_TRT_AMX
static_assert(eagle_trt::kLanes == 16, "AMX builds have AVX-512");
#endif

namespace {

using namespace eagle_trt;

// Query rows per task: their G query vectors each share one pass over the head's keys.
constexpr int kRows = 3;

struct Layout {
    int H, Hkv, G, S, Sp, D, Dp, T;
};

// Per call: K transposed to [Hkv][D][Sp] in fp32, so a score is one lane's sequential sum over head_dim (whatever lane
// its key lands in); V to [Hkv][S][Dp] fp32 only where head_dim is not a whole number of vectors (else the sums read
// V where it is, see Values). An output element is one lane's sum over the keys either way.
void convert_kv(const Layout& L, const void* k, int64_t k_sh, int64_t k_sr, const void* v, int64_t v_sh,
                int64_t v_sr, int bf16, float* kt, float* vv, int hk, int j0, int j1) {
    float row[1024];
    for (int j = j0; j < j1; ++j) {
        if (kt) {  // null when the scores run on AMX tiles from packed bf16 K
            to_float(k, (int64_t)hk * k_sh + (int64_t)j * k_sr, bf16, L.D, row);
            float* dst = kt + (int64_t)hk * L.D * L.Sp + j;
            for (int d = 0; d < L.D; ++d) dst[(int64_t)d * L.Sp] = row[d];
        }
        if (!vv) continue;  // null when the sums read V where it is (see Values)
        float* vd = vv + ((int64_t)hk * L.S + j) * L.Dp;
        to_float(v, (int64_t)hk * v_sh + (int64_t)j * v_sr, bf16, L.D, vd);
        for (int d = L.D; d < L.Dp; ++d) vd[d] = 0.0f;
    }
}

// Slots of a padded row of scores (K transposed, raw scores): S rounded up to a multiple of 16 (whole vectors, whole
// AMX key tiles), then to an odd multiple, so that the rows of K, 4 * Sp bytes apart, spread over every set of the
// L1 cache instead of landing in a few (a row stride of 4 KB put all 64 rows of a head in one set, and a pass over
// them missed the cache at every row). Padding slots score 0 and are never listed: the results do not depend on Sp.
inline int padded_keys(int S) {
    const int sp = (S + 15) / 16 * 16;
    return (sp / 16) % 2 ? sp : sp + 16;
}

// One thread's working memory, reused across calls (see Buffer).
struct Scratch {
    int* idx = nullptr;      // [S] visible key slots, ascending
    float* raw = nullptr;    // [kRows * G][Sp] scores of every slot, for each query vector of the task
    float* scores = nullptr; // [G][Sp] one row's scores of its visible keys, compacted, then their exp
    float* q = nullptr;      // [kRows * G][Dp] the task's query vectors
    float* acc = nullptr;    // [G][Dp]
    uint16_t* qb = nullptr;  // [kRows * G][head_dim padded to 32] the task's query vectors in bf16 (AMX scores)
    float* kbuf = nullptr;   // [kLanes][D] one block of bf16 keys widened (direct scores)

    // False if memory ran out.
    bool fit(const Layout& L) {
        static thread_local Buffer b_idx, b_raw, b_scores, b_q, b_acc, b_qb, b_kbuf;
        kbuf = b_kbuf.get<float>((size_t)kLanes * L.Dp);
        qb = b_qb.get<uint16_t>((size_t)kRows * L.G * ((L.D + 31) / 32 * 32));
        idx = b_idx.get<int>(L.S);
        raw = b_raw.get<float>((size_t)kRows * L.G * L.Sp);
        scores = b_scores.get<float>((size_t)L.G * L.Sp);
        q = b_q.get<float>((size_t)kRows * L.G * L.Dp);
        acc = b_acc.get<float>((size_t)L.G * L.Dp);
        return idx && raw && scores && q && acc && qb && kbuf;
    }
};

// The values of one KV head: row j at base + j * ld, in fp32 or bf16 (widened exactly on load). Either the caller's
// V itself (a cache's rows, when head_dim is a whole number of vectors) or its fp32 copy with padded rows.
struct Values {
    const void* base;
    int64_t ld;
    int bf16;
};

// acc[d] = sum over i of p[i] * v[idx[i]][d] (p >= 0, splat from memory: simd.h, vsplat). C vectors per row, kept
// in registers: with C below 8, even i and odd i summed apart, in order, then added (two chains in flight per lane);
// from 8 on (head_dim 64 on AVX2), one chain per lane in order, since 2C accumulators would not fit the 16 vector
// registers. The order depends on i, n and C only.
template <int C, typename V>
inline void weighted_sum(const V* v, int64_t ld, const int* idx, const float* p, int n, float* acc) {
    using E = Elem<V>;
    if constexpr (C >= 8) {
        vf a[C];
        for (int c = 0; c < C; ++c) a[c] = vf{};
        for (int i = 0; i < n; ++i) {
            const V* r = v + (int64_t)idx[i] * ld;
            const vf pi = vsplat(p + i);
            for (int c = 0; c < C; ++c) a[c] = vfma(E::load(r + c * kLanes), pi, a[c]);
        }
        for (int c = 0; c < C; ++c) vstore(acc + c * kLanes, a[c]);
        return;
    }
    vf a[C], b[C];
    for (int c = 0; c < C; ++c) a[c] = b[c] = vf{};
    int i = 0;
    for (; i + 1 < n; i += 2) {
        const V* r0 = v + (int64_t)idx[i] * ld;
        const V* r1 = v + (int64_t)idx[i + 1] * ld;
        const vf p0 = vsplat(p + i), p1 = vsplat(p + i + 1);
        for (int c = 0; c < C; ++c) {
            a[c] = vfma(E::load(r0 + c * kLanes), p0, a[c]);
            b[c] = vfma(E::load(r1 + c * kLanes), p1, b[c]);
        }
    }
    if (i < n) {
        const V* r0 = v + (int64_t)idx[i] * ld;
        const vf pi = vsplat(p + i);
        for (int c = 0; c < C; ++c) a[c] = vfma(E::load(r0 + c * kLanes), pi, a[c]);
    }
    for (int c = 0; c < C; ++c) vstore(acc + c * kLanes, a[c] + b[c]);
}

// The same sums for GB query heads at once (one pass over the values for all of them; each head's lanes sum over
// i in order). acc: GB rows of Dp.
template <int C, int GB, typename V>
inline void weighted_sum_heads(const V* v, int64_t ld, const int* idx, const float* p, int Sp, int n, int Dp,
                               float* acc) {
    vf a[GB][C];
    for (int g = 0; g < GB; ++g)
        for (int c = 0; c < C; ++c) a[g][c] = vf{};
    for (int i = 0; i < n; ++i) {
        const V* row = v + (int64_t)idx[i] * ld;
        vf r[C];
        for (int c = 0; c < C; ++c) r[c] = Elem<V>::load(row + c * kLanes);
        for (int g = 0; g < GB; ++g) {
            const vf pi = vsplat(p + g * Sp + i);
            for (int c = 0; c < C; ++c) a[g][c] = vfma(r[c], pi, a[g][c]);
        }
    }
    for (int g = 0; g < GB; ++g)
        for (int c = 0; c < C; ++c) vstore(acc + g * Dp + c * kLanes, a[g][c]);
}

// Output sums for all G heads of a row: heads in groups that fit the registers (at most 12 accumulators), else one
// head at a time. The grouping depends on G and head_dim only, so every call for a model takes the same path.
template <int C, typename V>
inline void weighted_sums(const V* v, int64_t ld, const int* idx, const float* p, int Sp, int n, int Dp, int G,
                          float* acc) {
    constexpr int GB = 12 / C >= 4 ? 4 : 12 / C;
    int g = 0;
    if constexpr (GB >= 2) {
        for (; g + GB <= G; g += GB) weighted_sum_heads<C, GB>(v, ld, idx, p + g * Sp, Sp, n, Dp, acc + g * Dp);
    }
    for (; g < G; ++g) weighted_sum<C>(v, ld, idx, p + g * Sp, n, acc + g * Dp);
}

template <typename V>
inline void weighted_sum_any(const V* v, int64_t ld, const int* idx, const float* p, int n, int Dp, float* acc) {
    std::memset(acc, 0, sizeof(float) * Dp);
    for (int i = 0; i < n; ++i) {
        const V* row = v + (int64_t)idx[i] * ld;
        const vf pi = vsplat(p + i);
        for (int c = 0; c < Dp; c += kLanes) vstore(acc + c, vfma(Elem<V>::load(row + c), pi, vload(acc + c)));
    }
}

// Every head's output sums of one row, from the values in their element type.
template <typename V>
void all_sums(const V* v, int64_t ld, const int* idx, const float* p, int Sp, int n, int Dp, int G, float* acc) {
    switch (Dp / kLanes) {
        case 1: weighted_sums<1>(v, ld, idx, p, Sp, n, Dp, G, acc); break;
        case 2: weighted_sums<2>(v, ld, idx, p, Sp, n, Dp, G, acc); break;
        case 4: weighted_sums<4>(v, ld, idx, p, Sp, n, Dp, G, acc); break;
        case 8: weighted_sums<8>(v, ld, idx, p, Sp, n, Dp, G, acc); break;
        default:
            for (int g = 0; g < G; ++g) weighted_sum_any(v, ld, idx, p + g * Sp, n, Dp, acc + g * Dp);
    }
}

// raw[v][j0 + i] = scale * (q_v . k_i) for i < nk <= kLanes keys (rows of keys, fp32, D = C vectors), for each of
// the nq query vectors: kLanes chains per vector (one per key slot of the block) over the C vectors of head_dim in
// order, then lane_sums. A block short of kLanes keys repeats its last key in the empty slots; their scores land in
// the row's padding (Sp is a whole number of vectors), which is never listed. So each listed score is the same
// function of its query vector and key in every block.
template <int C>
inline void score_keys(const float* qs, int nq, const float* const* keys, float scale, int Sp, float* raw) {
    for (int v = 0; v < nq; ++v) {
        const float* q = qs + (int64_t)v * C * kLanes;
        vf a[kLanes];
        for (int i = 0; i < kLanes; ++i) a[i] = vf{};
        for (int c = 0; c < C; ++c) {
            const vf qc = vload(q + c * kLanes);
            for (int i = 0; i < kLanes; ++i) a[i] = vfma(vload(keys[i] + c * kLanes), qc, a[i]);
        }
        vstore(raw + (int64_t)v * Sp, lane_sums(a) * scale);
    }
}

// Scores of the task's nq query vectors (rows of Dp = D floats) against every key of one KV head read where it is
// (row j at base + j * ld, fp32 or bf16; bf16 blocks are widened into kbuf first, exactly).
template <int C>
void score_rows(const float* qs, int nq, const void* base, int64_t ld, int bf16, int S, float scale, int Sp,
                float* raw, float* kbuf) {
    constexpr int D = C * kLanes;
    const float* keys[kLanes];
    for (int j0 = 0; j0 < S; j0 += kLanes) {
        const int nk = S - j0 < kLanes ? S - j0 : kLanes;
        for (int i = 0; i < kLanes; ++i) {
            const int j = j0 + (i < nk ? i : nk - 1);
            if (bf16) {
                if (i < nk) to_float(base, (int64_t)j * ld, 1, D, kbuf + i * D);
                keys[i] = kbuf + (i < nk ? i : nk - 1) * D;
            } else {
                keys[i] = static_cast<const float*>(base) + (int64_t)j * ld;
            }
        }
        score_keys<C>(qs, nq, keys, scale, Sp, raw + j0);
    }
}

// Scores from K where it is, for a head_dim of C whole vectors with C one of these; other head_dims take K
// transposed (score_block). Which path runs is fixed by the model's head_dim.
#define EAGLE_TRT_DIRECT_C(X) X(1) X(2) X(3) X(4) X(5) X(6) X(8) X(10) X(12) X(16)

inline bool direct_scores(int D) {
    if (D % kLanes) return false;
    switch (D / kLanes) {
#define EAGLE_TRT_CASE(c) case c:
        EAGLE_TRT_DIRECT_C(EAGLE_TRT_CASE) return true;
#undef EAGLE_TRT_CASE
        default: return false;
    }
}

void score_direct(const float* qs, int nq, const void* base, int64_t ld, int bf16, int S, int D, float scale, int Sp,
                  float* raw, float* kbuf) {
    switch (D / kLanes) {
#define EAGLE_TRT_CASE(c) case c: score_rows<c>(qs, nq, base, ld, bf16, S, scale, Sp, raw, kbuf); break;
        EAGLE_TRT_DIRECT_C(EAGLE_TRT_CASE)
#undef EAGLE_TRT_CASE
        default: break;
    }
}

// raw[v][j] = scale * sum over d, in order, of q_v[d] * k_j[d]: R query vectors by KB key vectors at a time
// (R * KB chains in flight). Every (vector, slot) pair is the same chain of fused multiply-adds whichever block
// computes it.
template <int R, int KB>
inline void score_tile(const float* qs, const float* kcol, int D, int Dp, int Sp, float scale, float* raw) {
    vf a[R][KB];
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < KB; ++b) a[r][b] = vf{};
    for (int d = 0; d < D; ++d) {
        const float* kd = kcol + (int64_t)d * Sp;
        vf k[KB];
        for (int b = 0; b < KB; ++b) k[b] = vload(kd + b * kLanes);
        for (int r = 0; r < R; ++r) {
            const float qd = qs[r * Dp + d];
            for (int b = 0; b < KB; ++b) a[r][b] = vfma(k[b], qd, a[r][b]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < KB; ++b) vstore(raw + (int64_t)r * Sp + b * kLanes, a[r][b] * scale);
}

template <int KB>
inline void score_tiles(const float* qs, int nq, const float* kcol, int D, int Dp, int Sp, float scale, float* raw) {
    int v = 0;
    for (; v + 4 <= nq; v += 4) score_tile<4, KB>(qs + v * Dp, kcol, D, Dp, Sp, scale, raw + (int64_t)v * Sp);
    switch (nq - v) {
        case 3: score_tile<3, KB>(qs + v * Dp, kcol, D, Dp, Sp, scale, raw + (int64_t)v * Sp); break;
        case 2: score_tile<2, KB>(qs + v * Dp, kcol, D, Dp, Sp, scale, raw + (int64_t)v * Sp); break;
        case 1: score_tile<1, KB>(qs + v * Dp, kcol, D, Dp, Sp, scale, raw + (int64_t)v * Sp); break;
        default: break;
    }
}

void score_block(const float* qs, int nq, const float* khead, int D, int Dp, int Sp, float scale, float* raw) {
    int j = 0;
    for (; j + 2 * kLanes <= Sp; j += 2 * kLanes) score_tiles<2>(qs, nq, khead + j, D, Dp, Sp, scale, raw + j);
    if (j < Sp) score_tiles<1>(qs, nq, khead + j, D, Dp, Sp, scale, raw + j);
}

#ifdef EAGLE_TRT_AMX
// bf16 scores on AMX tiles: the same raw[v][j] as score_block, each one the tile instruction's sum over head_dim in
// blocks of 32 (pairs in its fixed order, blocks in order). The instruction treats every (row, column) of a tile
// apart, so a score depends on its query vector and key alone, whatever else shares the tile.
//
// K is packed per call as [Hkv][key tile of 16][block of 32 dims][16 dim pairs][16 keys][2]: one 1 KB B tile per
// (key tile, block); head_dim is padded with zeros to a multiple of 32 and keys to a multiple of 16 (zero products
// add nothing).
bool amx_granted() {
    static const bool ok = request_amx();
    return ok;
}

constexpr int kTileKeys = 16, kTileDims = 32, kTileElems = 16 * 16 * 2;

inline int64_t packed_k_elems(const Layout& L) {
    return (int64_t)L.Hkv * (L.Sp / kTileKeys) * ((L.D + kTileDims - 1) / kTileDims) * kTileElems;
}

void pack_k(const Layout& L, const uint16_t* k, int64_t k_sh, int64_t k_sr, uint16_t* kp, int hk, int j0, int j1) {
    const int blocks = (L.D + kTileDims - 1) / kTileDims;
    uint16_t* head = kp + (int64_t)hk * (L.Sp / kTileKeys) * blocks * kTileElems;
    for (int j = j0; j < j1; ++j) {
        uint16_t* tile_row = head + (int64_t)(j / kTileKeys) * blocks * kTileElems + (j % kTileKeys) * 2;
        const uint16_t* src = k + (int64_t)hk * k_sh + (int64_t)j * k_sr;
        for (int b = 0; b < blocks; ++b) {
            uint16_t* t = tile_row + (int64_t)b * kTileElems;
            for (int pr = 0; pr < 16; ++pr) {
                const int d = b * kTileDims + 2 * pr;
                t[pr * 32] = j < L.S && d < L.D ? src[d] : 0;
                t[pr * 32 + 1] = j < L.S && d + 1 < L.D ? src[d + 1] : 0;
            }
        }
    }
}

// raw[v][j] = scale * q_v . k_j for the task's nq query vectors (bf16 rows of qb, Dq = head_dim padded to 32).
void score_block_amx(const uint16_t* qb, int nq, int Dq, const uint16_t* kp_head, int Sp, float scale, float* raw) {
    const int blocks = Dq / kTileDims, tiles = Sp / kTileKeys;
    alignas(64) float c[16 * 16];
    for (int v0 = 0; v0 < nq; v0 += 16) {
        const int m = nq - v0 < 16 ? nq - v0 : 16;
        TileConfig cfg;
        cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = static_cast<uint8_t>(m);
        cfg.rows[6] = cfg.rows[7] = 16;
        cfg.colsb[0] = cfg.colsb[1] = cfg.colsb[4] = cfg.colsb[6] = cfg.colsb[7] = 64;
        _tile_loadconfig(&cfg);
        const uint16_t* a = qb + (int64_t)v0 * Dq;
        int jt = 0;
        for (; jt + 1 < tiles; jt += 2) {
            _tile_zero(0);
            _tile_zero(1);
            const uint16_t* b0 = kp_head + (int64_t)jt * blocks * kTileElems;
            for (int b = 0; b < blocks; ++b) {
                _tile_loadd(4, a + b * kTileDims, Dq * 2);
                _tile_loadd(6, b0 + (int64_t)b * kTileElems, 64);
                _tile_loadd(7, b0 + (int64_t)(blocks + b) * kTileElems, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
            }
            for (int t = 0; t < 2; ++t) {
                if (t == 0) _tile_stored(0, c, 64);
                else _tile_stored(1, c, 64);
                for (int r = 0; r < m; ++r)
                    vstore(raw + (int64_t)(v0 + r) * Sp + (jt + t) * kTileKeys, vload(c + r * 16) * scale);
            }
        }
        if (jt < tiles) {
            _tile_zero(0);
            const uint16_t* b0 = kp_head + (int64_t)jt * blocks * kTileElems;
            for (int b = 0; b < blocks; ++b) {
                _tile_loadd(4, a + b * kTileDims, Dq * 2);
                _tile_loadd(6, b0 + (int64_t)b * kTileElems, 64);
                _tile_dpbf16ps(0, 4, 6);
            }
            _tile_stored(0, c, 64);
            for (int r = 0; r < m; ++r)
                vstore(raw + (int64_t)(v0 + r) * Sp + jt * kTileKeys, vload(c + r * 16) * scale);
        }
    }
}
#endif

// out[o + g * D + d] = acc[g][d] / sums[g], as fp32 or rounded to bfloat16 (nearest, ties to even).
inline void store_rows(const float* acc, const float* sums, int G, int D, int Dp, void* out, int64_t o, int bf16) {
    for (int g = 0; g < G; ++g) {
        int d0 = 0;
        if (bf16) {  // whole vectors: the same division and rounding on every lane
            const vf sum = vf{} + sums[g];
            uint16_t* dst = static_cast<uint16_t*>(out) + o + g * D;
            for (; d0 + kLanes <= D; d0 += kLanes) vstore_bf16(dst + d0, vload(acc + g * Dp + d0) / sum);
        }
        for (int d = d0; d < D; ++d) {
            const float x = acc[g * Dp + d] / sums[g];
            if (!bf16) {
                static_cast<float*>(out)[o + g * D + d] = x;
                continue;
            }
            static_cast<uint16_t*>(out)[o + g * D + d] = to_bf16(x);
        }
    }
}

// One row's softmax and output for its G query heads, from that row's scores of every slot (raw: [G][Sp]).
void finish_row(const Layout& L, int t, int hk, const float* raw, const Values& vals, const uint8_t* mask, void* out,
                int bf16, Scratch& w) {
    const int D = L.D, Dp = L.Dp, S = L.S, Sp = L.Sp, G = L.G;
    const uint8_t* visible = mask ? mask + (int64_t)t * S : nullptr;
    // The list starts with the run of visible slots from the first visible one (the committed prefix, from slot 0,
    // or from the window's first key in a sliding-window layer: every slot for one row), listed without a test per
    // slot; the rest (the row's ancestors in a tree) one by one. Either way the list is the visible slots in order.
    int lo = 0, end = S;  // the run is slots [lo, end)
    if (visible) {
        while (lo < S && !visible[lo]) ++lo;
        const void* hidden = lo < S ? std::memchr(visible + lo, 0, S - lo) : nullptr;
        if (hidden) end = static_cast<int>(static_cast<const uint8_t*>(hidden) - visible);
    }
    const int run = end - lo;
    for (int j = 0; j < run; ++j) w.idx[j] = lo + j;
    int n = run;
    for (int j = end + 1; j < S; ++j)
        if (visible[j]) w.idx[n++] = j;
    float sums[64];
    const int64_t o = (int64_t)t * L.H * D + (int64_t)hk * G * D;  // first output element of this task
    if (n == 0) {  // no visible key: zeros (a forward never asks this: a row always sees itself)
        for (int g = 0; g < G; ++g) {
            std::memset(w.acc + g * Dp, 0, sizeof(float) * Dp);
            sums[g] = 1.0f;
        }
        store_rows(w.acc, sums, G, D, Dp, out, o, bf16);
        return;
    }
    const int full = n / kLanes * kLanes;
    for (int g = 0; g < G; ++g) {
        float* s = w.scores + g * Sp;
        const float* rg = raw + (int64_t)g * Sp;
        std::memcpy(s, rg + lo, sizeof(float) * run);
        for (int i = run; i < n; ++i) s[i] = rg[w.idx[i]];
        // Softmax weights over the visible keys, unnormalised: exp(score - max).
        const float m = max_of(s, n);
        vf total = vf{};
        for (int i = 0; i < full; i += kLanes) {
            const vf e = vexp(vload(s + i) - m);
            vstore(s + i, e);
            total += e;
        }
        if (full < n) {
            float tail[kLanes];
            for (int l = 0; l < kLanes; ++l) tail[l] = full + l < n ? s[full + l] - m : 0.0f;
            vf e = vexp(vload(tail));
            for (int l = 0; l < kLanes; ++l) {
                if (full + l >= n) e[l] = 0.0f;
                else s[full + l] = e[l];
            }
            total += e;
        }
        sums[g] = lane_sum(total);
    }
#ifdef EAGLE_TRT_MUTATE_ATTENTION
    // Test-only (tests/test_native_mutation.py): the last row of a many-row call sums its values in reverse key order.
    if (L.T > 1 && t == L.T - 1) {
        for (int i = 0, j = n - 1; i < j; ++i, --j) {
            std::swap(w.idx[i], w.idx[j]);
            for (int g = 0; g < G; ++g) std::swap(w.scores[g * Sp + i], w.scores[g * Sp + j]);
        }
    }
#endif
    // Output: weights times values, keys in order, one lane per element of head_dim.
    if (vals.bf16)
        all_sums(static_cast<const uint16_t*>(vals.base), vals.ld, w.idx, w.scores, Sp, n, Dp, G, w.acc);
    else
        all_sums(static_cast<const float*>(vals.base), vals.ld, w.idx, w.scores, Sp, n, Dp, G, w.acc);
    store_rows(w.acc, sums, G, D, Dp, out, o, bf16);
}

// The caller's K: head h, row j at base + h * sh + j * sr elements.
struct Keys {
    const void* base;
    int64_t sh, sr;
};

// Rows [t0, t1) (at most kRows) of KV head hk. Scores from K where it is (kt and kp null), K transposed (kt) or K
// packed for AMX (kp).
void one_task(const Layout& L, int t0, int t1, int hk, const void* q, int64_t q_sh, int64_t q_sr, const Keys& keys,
              const float* kt, const uint16_t* kp, const Values& vals, const uint8_t* mask, void* out, float scale,
              int bf16, Scratch& w) {
    const int G = L.G, Dp = L.Dp, nq = (t1 - t0) * G;
#ifdef EAGLE_TRT_AMX
    if (kp) {
        const int Dq = (L.D + 31) / 32 * 32;
        int v = 0;
        for (int t = t0; t < t1; ++t)
            for (int g = 0; g < G; ++g, ++v) {
                const uint16_t* src =
                    static_cast<const uint16_t*>(q) + (int64_t)(hk * G + g) * q_sh + (int64_t)t * q_sr;
                uint16_t* dst = w.qb + (int64_t)v * Dq;
                std::memcpy(dst, src, sizeof(uint16_t) * L.D);
                for (int d = L.D; d < Dq; ++d) dst[d] = 0;
            }
        const int64_t per_head = (int64_t)(L.Sp / kTileKeys) * (Dq / kTileDims) * kTileElems;
        score_block_amx(w.qb, nq, Dq, kp + hk * per_head, L.Sp, scale, w.raw);
    } else
#endif
    {
        int v = 0;
        for (int t = t0; t < t1; ++t)
            for (int g = 0; g < G; ++g, ++v) {
                float* qv = w.q + v * Dp;
                to_float(q, (int64_t)(hk * G + g) * q_sh + (int64_t)t * q_sr, bf16, L.D, qv);
                for (int d = L.D; d < Dp; ++d) qv[d] = 0.0f;
            }
        if (kt) {
            score_block(w.q, nq, kt + (int64_t)hk * L.D * L.Sp, L.D, Dp, L.Sp, scale, w.raw);
        } else {
            const void* kh = static_cast<const char*>(keys.base) + hk * keys.sh * (bf16 ? 2 : 4);
            score_direct(w.q, nq, kh, keys.sr, bf16, L.S, L.D, scale, L.Sp, w.raw, w.kbuf);
        }
    }
    for (int t = t0; t < t1; ++t) finish_row(L, t, hk, w.raw + (int64_t)(t - t0) * G * L.Sp, vals, mask, out, bf16, w);
}

}  // namespace

extern "C" {

// q: [H, T, D]; k, v: [Hkv, S, D] (strides in elements: per head, per row; the last dim contiguous);
// mask: [T, S] bytes, nonzero = visible, or null (every key visible); out: [T, H * D] contiguous, in the inputs'
// type. bf16: 0 for fp32 inputs and output, 1 for bfloat16. Returns 0; -1 if working memory could not be
// allocated; -2 for a shape it does not take (more than 64 query heads per KV head, head_dim above 1024).
int eagle_trt_tree_attention(const void* q, int64_t q_sh, int64_t q_sr, const void* k, int64_t k_sh, int64_t k_sr,
                             const void* v, int64_t v_sh, int64_t v_sr, const uint8_t* mask, void* out, int H,
                             int Hkv, int T, int S, int D, float scale, int bf16, int threads) {
    if (Hkv <= 0 || H % Hkv != 0 || H / Hkv > 64 || D > 1024 || S <= 0) return -2;
    Layout L{H, Hkv, H / Hkv, S, padded_keys(S), D, (D + kLanes - 1) / kLanes * kLanes, T};
    static thread_local Buffer b_kt, b_vv, b_kp;  // the calling thread's: K transposed and V as fp32; K packed
    float* kt = nullptr;
    uint16_t* kp = nullptr;
#ifdef EAGLE_TRT_AMX
    // bf16 scores on AMX tiles wherever the CPU grants them: a property of the process, the same for every call.
    if (bf16 && amx_granted()) {
        kp = b_kp.get<uint16_t>((size_t)packed_k_elems(L));
        if (!kp) return -1;
    }
#endif
    if (!kp && !direct_scores(D)) {
        kt = b_kt.get<float>((size_t)Hkv * D * L.Sp);
        if (!kt) return -1;
        for (int hk = 0; hk < Hkv; ++hk)  // padding slots score 0 and are never listed as visible
            for (int d = 0; d < D; ++d)
                for (int j = S; j < L.Sp; ++j) kt[((int64_t)hk * D + d) * L.Sp + j] = 0.0f;
    }
    // V is read where it is when its rows are whole vectors, else copied to fp32. A bf16 V is read where it is
    // too, widened at each read (exact): a per-call fp32 copy of it made calls of 4 to 17 rows slower, not faster,
    // at every context measured (docs/bench.md, "Attention without the per-call copy of V").
    float* vv = nullptr;
    if (L.Dp != D) {
        vv = b_vv.get<float>((size_t)Hkv * S * L.Dp);
        if (!vv) return -1;
    }
    const int blocks = kt || vv || kp ? (S + 63) / 64 : 0;  // K and V need no copy when read where they are
    const int row_blocks = (T + kRows - 1) / kRows;
    const int tasks = row_blocks * Hkv;
    const int nthreads = threads > 0 ? threads : 1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        if (blocks > 0)  // the same on every thread
#pragma omp for schedule(static)
        for (int b = 0; b < Hkv * blocks; ++b) {
            const int hk = b / blocks, j0 = (b % blocks) * 64;
            convert_kv(L, k, k_sh, k_sr, v, v_sh, v_sr, bf16, kt, vv, hk, j0, j0 + 64 < S ? j0 + 64 : S);
#ifdef EAGLE_TRT_AMX
            // Packed K: this block's keys, and the zero keys padding the last tile.
            if (kp) pack_k(L, static_cast<const uint16_t*>(k), k_sh, k_sr, kp, hk, j0, j0 + 64 < S ? j0 + 64 : L.Sp);
#endif
        }
#ifdef EAGLE_TRT_AMX
        TileConfig saved;  // other kernels in the process (oneDNN, the projections) keep their tile state
        if (kp) _tile_storeconfig(&saved);
#endif
        Scratch w;
        const bool ok = w.fit(L);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; ++task) {
            if (!ok) continue;
            // Row blocks as even as kRows allows (4 rows: 2 + 2, not 3 + 1): a task costs about its rows, and the
            // static schedule gives each thread whole blocks, so 3 + 1 left one thread three quarters of the work.
            const int b = task / Hkv, base = T / row_blocks, extra = T % row_blocks;
            const int t0 = b * base + (b < extra ? b : extra), t1 = t0 + base + (b < extra);
            const int hk = task % Hkv;
            const Values vals = vv ? Values{vv + (int64_t)hk * S * L.Dp, L.Dp, 0}
                                   : Values{static_cast<const char*>(v) + hk * v_sh * (bf16 ? 2 : 4), v_sr, bf16};
            one_task(L, t0, t1, hk, q, q_sh, q_sr, Keys{k, k_sh, k_sr}, kt, kp, vals, mask, out, scale, bf16, w);
        }
#ifdef EAGLE_TRT_AMX
        if (kp) _tile_loadconfig(&saved);
#endif
    }
    return failed ? -1 : 0;
}

}  // extern "C"
