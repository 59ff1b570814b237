// The target's whole decoder stack in one call: every layer's norms, projections, RoPE + cache write, attention and
// MLP, then the final norm, for fp32 or bf16 activations and whichever projection kernel the engine chose.
//
// Why: a one-token forward makes about 270 kernel calls (9 a layer, 30 layers), each of which from Python would cost
// a ctypes transition, argument checks and tensor views. Here the kernels run in a fixed order on the same buffers,
// and each of them keeps every row a function of that row alone, so a verify row still equals decoding its token
// alone (tests/test_native_stack.py against the torch reference).
//
// Each layer: h = norm(x + pending MLP output); qkv = h @ Wqkv; q and k heads normed (Qwen3, Gemma 3); q, k, v
// roped, k and v into the cache; attention; h = norm(x += attention @ Wo); pending = act(h @ Wgate) * (h @ Wup) @
// Wdown, act SiLU or GELU-tanh. Gemma 3 norms the attention and MLP outputs too before they are added (its post-
// attention and post-feedforward norms), and its sliding-window layers take their own RoPE tables and each part's
// window mask. Layer i's output (x after its MLP is added) is copied to the aux features when i is listed.
//
// Batched: the rows may be several requests' (each its own tree, positions, mask and KV cache). Norms and projections
// run over every row at once, so one read of each weight serves the whole batch; RoPE, the cache write and attention
// run part by part on each request's own cache.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "stack_common.h"

namespace {

using namespace eagle_trt;

// Per-layer pointers, in this order (one row of the caller's table).
// Null where the model has none: kQkvBias, kQNorm and kKNorm (q/k head norms), kAttnOutNorm and kMlpOutNorm (norms of
// the attention and MLP outputs before the residual add).
enum Slot { kInputNorm, kQkv, kQkvBias, kO, kPostNorm, kGateUp, kDown, kQNorm, kKNorm, kAttnOutNorm, kMlpOutNorm,
            kSlots };

struct Dims {
    int64_t T, hidden, H, Hkv, D, I;
};

// What differs between layers and models beyond the weights: the attention scale, the MLP's activation (0 SiLU, 1
// GELU-tanh), and the sliding-window layers (local_layers [L] bytes, or null for none) with their RoPE tables.
template <typename T>
struct LayerKinds {
    float scale;
    int act;
    const uint8_t* local_layers;
    const T *cos_local, *sin_local;
};

// Scratch layout: one caller buffer carved into the layer's intermediates (each read before the next layer writes
// it).
template <typename T>
struct Scratch {
    T *h, *qkv, *q, *att, *o, *gu, *a, *d;
};

// x [T, hidden] into feature slot j of aux_out [T, n_aux * hidden].
template <typename T>
void copy_feature(const T* x, int64_t rows, int64_t hidden, int64_t n_aux, int64_t j, T* aux_out) {
    for (int64_t t = 0; t < rows; ++t)
        std::memcpy(aux_out + (t * n_aux + j) * hidden, x + t * hidden, hidden * sizeof(T));
}

template <typename T>
Scratch<T> carve(T* base, const Dims& s) {
    Scratch<T> w;
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

template <typename T>
int attend_parts(const Scratch<T>& w, const Part<T>* parts, int64_t n_parts, int64_t i, const void* qkv_bias,
                 const T* cos, const T* sin, const Dims& s, float scale, bool local, int threads) {
    constexpr int bf16 = sizeof(T) == 2;
    const int64_t H = s.H, Hkv = s.Hkv, D = s.D, qkv_w = (H + 2 * Hkv) * D;
    for (int64_t p = 0; p < n_parts; ++p) {
        const Part<T>& pt = parts[p];
        T* kc = pt.k + i * pt.layer_stride;
        T* vc = pt.v + i * pt.layer_stride;
        T* q = w.q + pt.row0 * H * D;  // this part's [H, rows, D] block
        int rc = eagle_trt_rope_qkv(w.qkv + pt.row0 * qkv_w, qkv_bias, cos + pt.row0 * D, sin + pt.row0 * D, q, kc,
                                    pt.head_stride, pt.row_stride, vc, pt.head_stride, pt.row_stride, pt.start,
                                    pt.rows, H, Hkv, D, bf16, threads);
        if (rc) return rc;
        rc = eagle_trt_tree_attention(q, pt.rows * D, D, kc, pt.head_stride, pt.row_stride, vc, pt.head_stride,
                                      pt.row_stride, local ? pt.local_mask : pt.mask, w.att + pt.row0 * H * D, static_cast<int>(H),
                                      static_cast<int>(Hkv), static_cast<int>(pt.rows),
                                      static_cast<int>(pt.start + pt.rows), static_cast<int>(D), scale, bf16,
                                      threads);
        if (rc) return rc;
    }
    return 0;
}

// The q and k heads of every row of qkv [T, (H + 2 Hkv) D], each normed in place by its weight (Qwen3, Gemma 3).
template <typename T>
int norm_heads(T* qkv, const void* q_norm, const void* k_norm, const Dims& s, float eps, int threads) {
    constexpr int bf16 = sizeof(T) == 2;
    const int64_t qkv_w = (s.H + 2 * s.Hkv) * s.D;
    int rc = eagle_trt_head_rms_norm(qkv, q_norm, s.T, s.H, s.D, qkv_w, eps, bf16, threads);
    return rc ? rc : eagle_trt_head_rms_norm(qkv + s.H * s.D, k_norm, s.T, s.Hkv, s.D, qkv_w, eps, bf16, threads);
}

template <typename T>
int stack(T* x, const void* const* weights, int64_t L, const T* final_norm, T* h_out, const T* cos, const T* sin,
          const LayerKinds<T>& kinds, const Part<T>* parts, int64_t n_parts, const Dims& s, float eps,
          const int64_t* aux_layers, int64_t n_aux, T* aux_out, T* scratch, Projection project, int threads) {
    constexpr int bf16 = sizeof(T) == 2;
    const Scratch<T> w = carve(scratch, s);
    const int64_t T_ = s.T, hidden = s.hidden, H = s.H, Hkv = s.Hkv, D = s.D, I = s.I;
    const int64_t qkv_w = (H + 2 * Hkv) * D;
    const T* pending = nullptr;
    int64_t next_aux = 0;
    int rc = 0;
    for (int64_t i = 0; i < L; ++i) {
        const void* const* lw = weights + i * kSlots;
        const bool local = kinds.local_layers && kinds.local_layers[i];
        if ((rc = eagle_trt_add_rms_norm(x, pending, lw[kInputNorm], w.h, T_, hidden, eps, bf16, threads))) return rc;
        if (next_aux < n_aux && aux_layers[next_aux] == i - 1)  // x is now layer i-1's output
            copy_feature(x, T_, hidden, n_aux, next_aux++, aux_out);
        if ((rc = project(w.h, lw[kQkv], w.qkv, T_, hidden, qkv_w, threads))) return rc;
        if (lw[kQNorm] && (rc = norm_heads(w.qkv, lw[kQNorm], lw[kKNorm], s, eps, threads))) return rc;
        if ((rc = attend_parts(w, parts, n_parts, i, lw[kQkvBias], local ? kinds.cos_local : cos,
                               local ? kinds.sin_local : sin, s, kinds.scale, local, threads)))
            return rc;
        if ((rc = project(w.att, lw[kO], w.o, T_, H * D, hidden, threads))) return rc;
        if (lw[kAttnOutNorm] &&  // in place: each element is read before it is written
            (rc = eagle_trt_add_rms_norm(w.o, nullptr, lw[kAttnOutNorm], w.o, T_, hidden, eps, bf16, threads)))
            return rc;
        if ((rc = eagle_trt_add_rms_norm(x, w.o, lw[kPostNorm], w.h, T_, hidden, eps, bf16, threads))) return rc;
        if ((rc = project(w.h, lw[kGateUp], w.gu, T_, hidden, 2 * I, threads))) return rc;
        rc = kinds.act ? eagle_trt_gelu_tanh_mul(w.gu, w.a, T_, I, bf16, threads)
                       : eagle_trt_silu_mul(w.gu, w.a, T_, I, bf16, threads);
        if (rc) return rc;
        if ((rc = project(w.a, lw[kDown], w.d, T_, I, hidden, threads))) return rc;
        if (lw[kMlpOutNorm] &&
            (rc = eagle_trt_add_rms_norm(w.d, nullptr, lw[kMlpOutNorm], w.d, T_, hidden, eps, bf16, threads)))
            return rc;
        pending = w.d;
    }
    if ((rc = eagle_trt_add_rms_norm(x, pending, final_norm, h_out, T_, hidden, eps, bf16, threads))) return rc;
    if (next_aux < n_aux && aux_layers[next_aux] == L - 1) copy_feature(x, T_, hidden, n_aux, next_aux++, aux_out);
    return next_aux == n_aux ? 0 : -2;  // an aux id out of range or out of order
}


template <typename T>
int run_stack(void* x, const void* const* weights, int64_t L, const void* final_norm, void* h_out, const void* cos,
              const void* sin, const void* cos_local, const void* sin_local, const uint8_t* local_layers, float scale,
              int act, int64_t n_parts, const int64_t* table, void* const* caches, const uint8_t* const* masks,
              const uint8_t* const* local_masks, const Dims& s, float eps, const int64_t* aux_layers, int64_t n_aux,
              void* aux_out, void* scratch, Projection project, int threads) {
    std::vector<Part<T>> parts(static_cast<size_t>(n_parts));
    if (read_parts(table, 5, caches, masks, n_parts, s.T, parts.data(), local_masks)) return -2;
    const LayerKinds<T> kinds{scale, act, local_layers,
                              static_cast<const T*>(cos_local ? cos_local : cos),
                              static_cast<const T*>(sin_local ? sin_local : sin)};
    return stack(static_cast<T*>(x), weights, L, static_cast<const T*>(final_norm), static_cast<T*>(h_out),
                 static_cast<const T*>(cos), static_cast<const T*>(sin), kinds, parts.data(), n_parts, s, eps,
                 aux_layers, n_aux, static_cast<T*>(aux_out), static_cast<T*>(scratch), project, threads);
}

}  // namespace

extern "C" {

// Elements of scratch (of the activations' dtype) the stack needs for T rows (native/stack.py allocates it).
int64_t eagle_trt_stack_scratch(int64_t T, int64_t hidden, int64_t H, int64_t Hkv, int64_t D, int64_t I) {
    return T * (3 * hidden + (H + 2 * Hkv) * D + 2 * H * D + 3 * I);
}

// x: [T, hidden], the embedded tokens of every part, updated in place to the last layer's output. weights: [L][kSlots]
// pointers (input norm, packed qkv, qkv bias or null, packed o, post norm, packed gate_up, packed down, then q norm,
// k norm [D], attention-output norm and MLP-output norm [hidden], each null where the model has none). cos, sin:
// [T, D]; local_layers: [L] bytes, nonzero for a sliding-window layer, which takes cos_local, sin_local and each
// part's local mask (null: no such layer). scale: the attention scores' factor; act: 0 SiLU, 1 GELU-tanh. The rows
// are n_parts consecutive parts (one per request in a batched pass), each with its own KV cache and
// mask: parts [n_parts][5] = rows, start, and the caches' layer, head and row strides in elements; caches
// [n_parts][2] = the part's [L, Hkv, capacity, D] K and V caches; masks [n_parts] = [rows, start + rows] bytes, or
// null for one causal row; local_masks [n_parts] the same less the keys outside the window (null, or a null entry:
// the part's mask). A part's rows are computed from its own tokens and cache alone, whatever else is in the
// pass: the projections keep every row a function of that row. aux_layers: n_aux ascending layer ids; aux_out:
// [T, n_aux * hidden] or null. h_out: [T, hidden], the final norm of the output. Every tensor fp32, or every one
// bf16 (bf16 = 1); kernel: the projections' weights (0 packed for eagle_trt_gemm, 1 for AMX tiles, bf16 only, 2
// block weights).
// Returns 0, or the first failing kernel's code (-2 also when the parts' rows do not add up to T).
int eagle_trt_decoder_stack(void* x, const void* const* weights, int64_t L, const void* final_norm, void* h_out,
                            const void* cos, const void* sin, const void* cos_local, const void* sin_local,
                            const uint8_t* local_layers, int64_t n_parts, const int64_t* parts, void* const* caches,
                            const uint8_t* const* masks, const uint8_t* const* local_masks, int64_t T, int64_t hidden,
                            int64_t H, int64_t Hkv, int64_t D, int64_t I, float eps, float scale, int act,
                            const int64_t* aux_layers, int64_t n_aux, void* aux_out, void* scratch, int bf16, int kernel,
                            int threads) {
    if (T <= 0 || L <= 0 || D <= 0 || n_parts <= 0 || act < 0 || act > 1) return -2;
    const Projection project = projection(bf16, kernel);
    if (!project) return -2;
    const Dims s{T, hidden, H, Hkv, D, I};
    if (bf16)
        return run_stack<uint16_t>(x, weights, L, final_norm, h_out, cos, sin, cos_local, sin_local, local_layers,
                                   scale, act, n_parts, parts, caches, masks, local_masks, s, eps, aux_layers, n_aux,
                                   aux_out, scratch, project, threads);
    return run_stack<float>(x, weights, L, final_norm, h_out, cos, sin, cos_local, sin_local, local_layers, scale, act,
                            n_parts, parts, caches, masks, local_masks, s, eps, aux_layers, n_aux, aux_out, scratch,
                            project, threads);
}

}  // extern "C"
