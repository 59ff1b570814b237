// The bf16 target's whole decoder stack in one call: every layer's norms, projections, RoPE + cache write,
// attention and MLP, then the final norm.
//
// Why: a one-token forward makes about 270 kernel calls (9 a layer, 30 layers). From Python each costs a ctypes
// transition, argument checks and tensor views, about a millisecond a token in all: close to a tenth of a decode
// step. Here the same kernels run in the same order on the same buffers, so the result is the same bits as the
// layer loop in models/llama.py (tests/test_decoder_stack.py), and a verify row still equals decoding its token
// alone.
//
// Each layer: h = norm(x + pending MLP output); qkv = h @ Wqkv; q, k, v roped, k and v into the cache; attention;
// h = norm(x += attention @ Wo); pending = silu(h @ Wgate) * (h @ Wup) @ Wdown. Layer i's output (x after its MLP
// is added) is copied to the aux features when i is listed.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace {

// Per-layer pointers, in this order (one row of the caller's table).
enum Slot { kInputNorm, kQkv, kQkvBias, kO, kPostNorm, kGateUp, kDown, kSlots };

struct Dims {
    int64_t T, hidden, H, Hkv, D, I;
};

// Scratch layout: one caller buffer carved into the layer's intermediates (each read before the next layer writes
// it, as in the Python loop).
struct Scratch {
    uint16_t *h, *qkv, *q, *att, *o, *gu, *a, *d;
};

// x [T, hidden] into feature slot j of aux_out [T, n_aux * hidden].
void copy_feature(const uint16_t* x, int64_t T, int64_t hidden, int64_t n_aux, int64_t j, uint16_t* aux_out) {
    for (int64_t t = 0; t < T; ++t)
        std::memcpy(aux_out + (t * n_aux + j) * hidden, x + t * hidden, hidden * sizeof(uint16_t));
}

Scratch carve(uint16_t* base, const Dims& s) {
    Scratch w;
    const int64_t qkv_w = (s.H + 2 * s.Hkv) * s.D;
    w.h = base;
    w.qkv = w.h + s.T * s.hidden;
    w.q = w.qkv + s.T * qkv_w;
    w.att = w.q + s.T * s.H * s.D;
    w.o = w.att + s.T * s.H * s.D;
    w.gu = w.o + s.T * s.hidden;
    w.a = w.gu + s.T * 2 * s.I;
    w.d = w.a + s.T * s.I;
    return w;
}

}  // namespace

extern "C" {

// Elements of scratch the stack needs for T rows (native_stack.py allocates it).
int64_t eagle_trt_stack_scratch(int64_t T, int64_t hidden, int64_t H, int64_t Hkv, int64_t D, int64_t I) {
    return T * (3 * hidden + (H + 2 * Hkv) * D + 2 * H * D + 3 * I);
}

// x: [T, hidden] bf16, the embedded tokens, updated in place to the last layer's output. weights: [L][kSlots]
// pointers (input norm, packed qkv, qkv bias or null, packed o, post norm, packed gate_up, packed down). cos, sin:
// [T, D]. k_cache, v_cache: the [L, Hkv, capacity, D] caches (strides in elements). mask: [T, start + T] bytes or
// null (one row). aux_layers: n_aux ascending layer ids; aux_out: [T, n_aux * hidden] or null. h_out: [T, hidden],
// the final norm of the output. Returns 0, or the first failing kernel's code.
int eagle_trt_decoder_stack(uint16_t* x, const uint16_t* const* weights, int64_t L, const uint16_t* final_norm,
                            uint16_t* h_out, const uint16_t* cos, const uint16_t* sin, uint16_t* k_cache,
                            uint16_t* v_cache, int64_t layer_stride, int64_t head_stride, int64_t row_stride,
                            int64_t start, const uint8_t* mask, int64_t T, int64_t hidden, int64_t H, int64_t Hkv,
                            int64_t D, int64_t I, float eps, const int64_t* aux_layers, int64_t n_aux,
                            uint16_t* aux_out, uint16_t* scratch, int threads) {
    if (T <= 0 || L <= 0 || D <= 0) return -2;
    const Dims s{T, hidden, H, Hkv, D, I};
    const Scratch w = carve(scratch, s);
    const int64_t qkv_w = (H + 2 * Hkv) * D, S = start + T;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));  // as native_attention.py
    const uint16_t* pending = nullptr;
    int64_t next_aux = 0;
    int rc = 0;
    for (int64_t i = 0; i < L; ++i) {
        const uint16_t* const* lw = weights + i * kSlots;
        if ((rc = eagle_trt_add_rms_norm(x, pending, lw[kInputNorm], w.h, T, hidden, eps, threads))) return rc;
        if (next_aux < n_aux && aux_layers[next_aux] == i - 1)  // x is now layer i-1's output
            copy_feature(x, T, hidden, n_aux, next_aux++, aux_out);
        if ((rc = eagle_trt_amx_gemm(w.h, lw[kQkv], w.qkv, T, hidden, qkv_w, threads))) return rc;
        uint16_t* kc = k_cache + i * layer_stride;
        uint16_t* vc = v_cache + i * layer_stride;
        if ((rc = eagle_trt_rope_qkv(w.qkv, lw[kQkvBias], cos, sin, w.q, kc, head_stride, row_stride, vc, head_stride,
                                     row_stride, start, T, H, Hkv, D, threads)))
            return rc;
        if ((rc = eagle_trt_tree_attention(w.q, T * D, D, kc, head_stride, row_stride, vc, head_stride, row_stride,
                                           mask, w.att, static_cast<int>(H), static_cast<int>(Hkv),
                                           static_cast<int>(T), static_cast<int>(S), static_cast<int>(D), scale, 1,
                                           threads)))
            return rc;
        if ((rc = eagle_trt_amx_gemm(w.att, lw[kO], w.o, T, H * D, hidden, threads))) return rc;
        if ((rc = eagle_trt_add_rms_norm(x, w.o, lw[kPostNorm], w.h, T, hidden, eps, threads))) return rc;
        if ((rc = eagle_trt_amx_gemm(w.h, lw[kGateUp], w.gu, T, hidden, 2 * I, threads))) return rc;
        if ((rc = eagle_trt_silu_mul(w.gu, w.a, T, I, threads))) return rc;
        if ((rc = eagle_trt_amx_gemm(w.a, lw[kDown], w.d, T, I, hidden, threads))) return rc;
        pending = w.d;
    }
    if ((rc = eagle_trt_add_rms_norm(x, pending, final_norm, h_out, T, hidden, eps, threads))) return rc;
    if (next_aux < n_aux && aux_layers[next_aux] == L - 1) copy_feature(x, T, hidden, n_aux, next_aux++, aux_out);
    return next_aux == n_aux ? 0 : -2;  // an aux id out of range or out of order
}

}  // extern "C"
