// The EAGLE-3 draft head's forward in one call: its input norms, the one decoder layer, the final norm and the
// draft LM head, for fp32 or bf16 activations and whichever projection kernel the engine chose.
//
// Why: drafting runs the head two to four times a speculative step, and as separate calls its forward is about
// twenty operator and kernel calls: a quarter of its time at two rows. The head only proposes tokens (verification
// decides what is kept), so its numerics need no invariance; this is for speed. The kernels are the target's
// (tests/test_native_stack.py compares it with the torch reference).
//
// hidden [T, H] is the fused feature (or the head's own output one step before); e [T, H] the input tokens'
// embeddings. x = [norm(e) ; norm(hidden')] with hidden' = norm(hidden) when the head norms its hidden input twice
// (modelopt's layout); out = hidden + attention, then out += MLP; logits = LM head(norm(out)) for the last row or
// all rows. Batched: the rows may be several requests' (each its own tree and head cache): norms and projections
// run over every row at once, RoPE, the cache write and attention part by part.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels.h"
#include "simd.h"
#include "stack_common.h"

namespace {

// Weight pointers, in this order (native_draft.py builds the table).
enum Slot { kInputNorm, kHiddenNorm, kQkv, kO, kPostNorm, kGateUp, kDown, kNorm, kLmHead, kSlots };

using namespace eagle_trt;

// The k largest log-softmax values of one row of logits, largest first (the earlier index first on ties), and
// their indices: logp = x - (max + log(sum of exp(x - max))). What drafting reads of the head's output, in one pass
// over the row instead of a conversion, a log-softmax and a top-k in torch.
template <typename T>
void top_logp(const T* row, int64_t V, int k, float* vals, int64_t* idx) {
    using E = Elem<T>;
    const float ninf = -std::numeric_limits<float>::infinity();
    float m = ninf;
    int64_t i = 0;
    vf mv = vf{} + ninf;
    for (; i + kLanes <= V; i += kLanes) {
        const vf x = E::load(row + i);
        mv = x > mv ? x : mv;
    }
    for (int l = 0; l < kLanes; ++l) m = mv[l] > m ? mv[l] : m;
    for (; i < V; ++i) m = E::get(row + i) > m ? E::get(row + i) : m;
    vf acc = vf{};
    for (i = 0; i + kLanes <= V; i += kLanes) acc += vexp(E::load(row + i) - m);
    float total = lane_sum(acc);
    for (; i < V; ++i) total += std::exp(E::get(row + i) - m);
    const float lse = m + std::log(total);
    int n = 0;  // filled slots of vals/idx, kept sorted
    auto offer = [&](float x, int64_t at) {
        if (n == k && !(x > vals[k - 1])) return;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && x > vals[j - 1]) {
            vals[j] = vals[j - 1];
            idx[j] = idx[j - 1];
            --j;
        }
        vals[j] = x;
        idx[j] = at;
    };
    for (i = 0; i + kLanes <= V; i += kLanes) {
        const vf x = E::load(row + i);
        if (n == k) {  // full: a vector with nothing above the k-th best is skipped whole
            bool above = false;
            for (int l = 0; l < kLanes; ++l) above |= x[l] > vals[k - 1];
            if (!above) continue;
        }
        for (int l = 0; l < kLanes; ++l) offer(x[l], i + l);
    }
    for (; i < V; ++i) offer(E::get(row + i), i);
    for (int j = 0; j < k; ++j) vals[j] -= lse;  // k <= V: every slot filled
}

template <typename T>
int attend_parts(const T* qkv, const T* cos, const T* sin, T* q, T* att, const Part<T>* parts, int64_t n_parts,
                 int64_t H, int64_t Hkv, int64_t D, int threads) {
    constexpr int bf16 = sizeof(T) == 2;
    const int64_t qkv_w = (H + 2 * Hkv) * D;
    for (int64_t p = 0; p < n_parts; ++p) {
        const Part<T>& pt = parts[p];
        T* qp = q + pt.row0 * H * D;  // this part's [H, rows, D] block
        int rc = eagle_trt_rope_qkv(qkv + pt.row0 * qkv_w, nullptr, cos + pt.row0 * D, sin + pt.row0 * D, qp, pt.k,
                                    pt.head_stride, pt.row_stride, pt.v, pt.head_stride, pt.row_stride, pt.start,
                                    pt.rows, H, Hkv, D, bf16, threads);
        if (rc) return rc;
        rc = eagle_trt_tree_attention(qp, pt.rows * D, D, pt.k, pt.head_stride, pt.row_stride, pt.v, pt.head_stride,
                                      pt.row_stride, pt.mask, att + pt.row0 * H * D, static_cast<int>(H),
                                      static_cast<int>(Hkv), static_cast<int>(pt.rows),
                                      static_cast<int>(pt.start + pt.rows), static_cast<int>(D), attention_scale(D),
                                      bf16, threads);
        if (rc) return rc;
    }
    return 0;
}

// prenorm's bits: kDoubleNorm, the feature normed by input_layernorm before hidden_norm (modelopt's head); and
// kNormedResidual, the layer's residual is hidden_norm's output rather than the feature (norm_before_residual).
constexpr int kDoubleNorm = 1, kNormedResidual = 2;

template <typename T>
int layer(const void* const* w, const T* hidden, const T* e, int prenorm, const T* cos, const T* sin,
          const Part<T>* parts, int64_t n_parts, int64_t T_, int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t I,
          int64_t vocab, float eps, int last_only, T* out, T* logits, T* scratch, Projection project, int threads) {
    constexpr int bf16 = sizeof(T) == 2;
    const int64_t qkv_w = (H + 2 * Hkv) * D;
    T* x = scratch;             // [T, 2n]: norm(e) ; norm(hidden')
    T* pre = x + T_ * 2 * n;    // [T, n]: hidden' (hidden normed once more)
    T* qkv = pre + T_ * n;      // [T, qkv_w]
    T* q = qkv + T_ * qkv_w;    // [H, rows, D] per part
    T* att = q + T_ * H * D;    // [T, H * D]
    T* o = att + T_ * H * D;    // [T, n]
    T* h = o + T_ * n;          // [T, n]
    T* gu = h + T_ * n;         // [T, 2I]
    T* a = gu + T_ * 2 * I;     // [T, I]
    T* d = a + T_ * I;          // [T, n]
    // The norm kernel reads x without writing it when there is no delta to add.
    T* hid = const_cast<T*>(hidden);
    int rc = 0;
    if (prenorm & kDoubleNorm) {
        if ((rc = eagle_trt_add_rms_norm(hid, nullptr, w[kInputNorm], pre, T_, n, eps, bf16, threads))) return rc;
        hid = pre;
    }
    for (int64_t t = 0; t < T_; ++t) {  // one row at a time: the two halves of x's row are written apart
        if ((rc = eagle_trt_add_rms_norm(const_cast<T*>(e) + t * n, nullptr, w[kInputNorm], x + t * 2 * n, 1, n, eps,
                                         bf16, 1)))
            return rc;
        if ((rc = eagle_trt_add_rms_norm(hid + t * n, nullptr, w[kHiddenNorm], x + t * 2 * n + n, 1, n, eps, bf16, 1)))
            return rc;
    }
    if ((rc = project(x, w[kQkv], qkv, T_, 2 * n, qkv_w, threads))) return rc;
    if ((rc = attend_parts(qkv, cos, sin, q, att, parts, n_parts, H, Hkv, D, threads))) return rc;
    if ((rc = project(att, w[kO], o, T_, H * D, n, threads))) return rc;
    if (prenorm & kNormedResidual) {  // the residual is the normed feature, x's second half, row by row
        for (int64_t t = 0; t < T_; ++t) std::memcpy(out + t * n, x + t * 2 * n + n, sizeof(T) * n);
    } else {
        std::memcpy(out, hidden, sizeof(T) * T_ * n);
    }
    if ((rc = eagle_trt_add_rms_norm(out, o, w[kPostNorm], h, T_, n, eps, bf16, threads))) return rc;
    if ((rc = project(h, w[kGateUp], gu, T_, n, 2 * I, threads))) return rc;
    if ((rc = eagle_trt_silu_mul(gu, a, T_, I, bf16, threads))) return rc;
    if ((rc = project(a, w[kDown], d, T_, I, n, threads))) return rc;
    if ((rc = eagle_trt_add_rms_norm(out, d, w[kNorm], h, T_, n, eps, bf16, threads))) return rc;
    if (!last_only) return project(h, w[kLmHead], logits, T_, n, vocab, threads);
    // Each part's last row, gathered (o is free now) so one pass over the LM head scores all of them.
    for (int64_t p = 0; p < n_parts; ++p)
        std::memcpy(o + p * n, h + (parts[p].row0 + parts[p].rows - 1) * n, sizeof(T) * n);
    return project(o, w[kLmHead], logits, n_parts, n, vocab, threads);
}


}  // namespace

extern "C" {

// Elements of scratch (of the activations' dtype) the draft layer needs for T rows.
int64_t eagle_trt_draft_scratch(int64_t T, int64_t hidden, int64_t H, int64_t Hkv, int64_t D, int64_t I) {
    return T * (2 * hidden + hidden + (H + 2 * Hkv) * D + 2 * H * D + 3 * hidden + 3 * I);
}

// w: kSlots pointers (norms, then projections for the chosen kernel: 0 packed for eagle_trt_gemm, 1 for AMX tiles,
// 2 block weights). hidden, e: [T, hidden], the rows of n_parts requests in order; out: [T, hidden], the layer's
// pre-norm output; logits: [T, vocab], or with last_only [n_parts, vocab] for each part's last row. parts
// [n_parts][4] = rows, start, and the cache's head and row strides in elements; caches [n_parts][2] = the part's head
// K and V caches ([Hkv, capacity, D]), written at rows start..start+rows-1; masks [n_parts] = [rows, start + rows]
// bytes or null. prenorm: kDoubleNorm | kNormedResidual bits (above). Every tensor fp32, or every one bf16 (bf16 = 1).
// Returns 0, or the first failing kernel's code
// (-2 also when the parts' rows do not add up to T).
int eagle_trt_draft_layer(const void* const* w, const void* hidden, const void* e, int prenorm, const void* cos,
                          const void* sin, int64_t n_parts, const int64_t* parts, void* const* caches,
                          const uint8_t* const* masks, int64_t T, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                          int64_t I, int64_t vocab, float eps, int last_only, void* out, void* logits, void* scratch,
                          int bf16, int kernel, int threads) {
    if (T <= 0 || n <= 0 || D <= 0 || n_parts <= 0) return -2;
    const Projection project = projection(bf16, kernel);
    if (!project) return -2;
    if (bf16) {
        using B = uint16_t;
        std::vector<Part<B>> ps(static_cast<size_t>(n_parts));
        if (read_parts(parts, 4, caches, masks, n_parts, T, ps.data())) return -2;
        return layer(w, static_cast<const B*>(hidden), static_cast<const B*>(e), prenorm, static_cast<const B*>(cos),
                     static_cast<const B*>(sin), ps.data(), n_parts, T, n, H, Hkv, D, I, vocab, eps, last_only,
                     static_cast<B*>(out), static_cast<B*>(logits), static_cast<B*>(scratch), project, threads);
    }
    std::vector<Part<float>> ps(static_cast<size_t>(n_parts));
    if (read_parts(parts, 4, caches, masks, n_parts, T, ps.data())) return -2;
    return layer(w, static_cast<const float*>(hidden), static_cast<const float*>(e), prenorm,
                 static_cast<const float*>(cos), static_cast<const float*>(sin), ps.data(), n_parts, T, n, H, Hkv, D,
                 I, vocab, eps, last_only, static_cast<float*>(out), static_cast<float*>(logits),
                 static_cast<float*>(scratch), project, threads);
}

// For each of `rows` rows of logits [rows, V] (fp32, or bf16 with bf16 = 1): its k largest log-softmax values,
// largest first, and their indices (vals, idx: [rows, k]). Returns 0; -2 unless 1 <= k <= V.
int eagle_trt_top_logp(const void* logits, int64_t rows, int64_t V, int k, float* vals, int64_t* idx, int bf16) {
    if (k < 1 || k > V) return -2;
    for (int64_t r = 0; r < rows; ++r) {
        if (bf16) top_logp(static_cast<const uint16_t*>(logits) + r * V, V, k, vals + r * k, idx + r * k);
        else top_logp(static_cast<const float*>(logits) + r * V, V, k, vals + r * k, idx + r * k);
    }
    return 0;
}

}  // extern "C"
