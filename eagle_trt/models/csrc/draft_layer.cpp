// The bf16 EAGLE-3 draft head's forward in one call: its input norms, the one decoder layer, the final norm and the
// draft LM head.
//
// Why: drafting runs the head two to four times a speculative step, and from Python its forward is about twenty
// operator and kernel calls: a quarter of its time at two rows. The head only proposes tokens (verification decides
// what is kept), so its numerics need no invariance; this is for speed. The kernels are the target's: AMX
// projections, fused row ops, and the compiled attention (tests/test_native_stack.py compares it with the torch
// operators).
//
// hidden [T, H] is the fused feature (or the head's own output one step before); e [T, H] the input tokens'
// embeddings. x = [norm(e) ; norm(hidden')] with hidden' = norm(hidden) when the head norms its hidden input twice
// (modelopt's layout); out = hidden + attention, then out += MLP; logits = LM head(norm(out)) for the last row or
// all rows.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "simd.h"

#include "kernels.h"

namespace {

// Weight pointers, in this order (native_draft.py builds the table).
enum Slot { kInputNorm, kHiddenNorm, kQkv, kO, kPostNorm, kGateUp, kDown, kNorm, kLmHead, kSlots };

using namespace eagle_trt;

// The k largest log-softmax values of one row of bf16 logits, largest first (the earlier index first on ties), and
// their indices: logp = x - (max + log(sum of exp(x - max))). What drafting reads of the head's output, in one pass
// over the row instead of a conversion, a log-softmax and a top-k in torch.
void top_logp(const uint16_t* row, int64_t V, int k, float* vals, int64_t* idx) {
    const float ninf = -std::numeric_limits<float>::infinity();
    float m = ninf;
    int64_t i = 0;
    vf mv = vf{} + ninf;
    for (; i + kLanes <= V; i += kLanes) {
        const vf x = vload_bf16(row + i);
        mv = x > mv ? x : mv;
    }
    for (int l = 0; l < kLanes; ++l) m = mv[l] > m ? mv[l] : m;
    for (; i < V; ++i) m = bf16_to_float(row[i]) > m ? bf16_to_float(row[i]) : m;
    vf acc = vf{};
    for (i = 0; i + kLanes <= V; i += kLanes) acc += vexp(vload_bf16(row + i) - m);
    float total = lane_sum(acc);
    for (; i < V; ++i) total += std::exp(bf16_to_float(row[i]) - m);
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
        const vf x = vload_bf16(row + i);
        if (n == k) {  // full: a vector with nothing above the k-th best is skipped whole
            bool above = false;
            for (int l = 0; l < kLanes; ++l) above |= x[l] > vals[k - 1];
            if (!above) continue;
        }
        for (int l = 0; l < kLanes; ++l) offer(x[l], i + l);
    }
    for (; i < V; ++i) offer(bf16_to_float(row[i]), i);
    for (int j = 0; j < k; ++j) vals[j] -= lse;  // k <= V: every slot filled
}

}  // namespace

extern "C" {

// Elements of scratch the draft layer needs for T rows.
int64_t eagle_trt_draft_scratch(int64_t T, int64_t hidden, int64_t H, int64_t Hkv, int64_t D, int64_t I) {
    return T * (2 * hidden + hidden + (H + 2 * Hkv) * D + 2 * H * D + 3 * hidden + 3 * I);
}

// weights: kSlots pointers (projections packed for the AMX kernel). hidden, e: [T, hidden]; out: [T, hidden], the
// layer's pre-norm output; logits: [T or 1, vocab]. k_cache, v_cache: the head's [Hkv, capacity, D] cache, written
// at rows start..start+T-1; mask [T, start + T] bytes or null. Returns 0, or the first failing kernel's code.
int eagle_trt_draft_layer(const uint16_t* const* w, const uint16_t* hidden, const uint16_t* e, int prenorm,
                          const uint16_t* cos, const uint16_t* sin, uint16_t* k_cache, uint16_t* v_cache,
                          int64_t head_stride, int64_t row_stride, int64_t start, const uint8_t* mask, int64_t T,
                          int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t I, int64_t vocab, float eps,
                          int last_only, uint16_t* out, uint16_t* logits, uint16_t* scratch, int threads) {
    if (T <= 0 || n <= 0 || D <= 0) return -2;
    const int64_t qkv_w = (H + 2 * Hkv) * D;
    uint16_t* x = scratch;                  // [T, 2n]: norm(e) ; norm(hidden')
    uint16_t* pre = x + T * 2 * n;          // [T, n]: hidden' (hidden normed once more)
    uint16_t* qkv = pre + T * n;            // [T, qkv_w]
    uint16_t* q = qkv + T * qkv_w;          // [H, T, D]
    uint16_t* att = q + T * H * D;          // [T, H * D]
    uint16_t* o = att + T * H * D;          // [T, n]
    uint16_t* h = o + T * n;                // [T, n]
    uint16_t* gu = h + T * n;               // [T, 2I]
    uint16_t* a = gu + T * 2 * I;           // [T, I]
    uint16_t* d = a + T * I;                // [T, n]
    // The norm kernel reads x without writing it when there is no delta to add.
    uint16_t* hid = const_cast<uint16_t*>(hidden);
    int rc = 0;
    if (prenorm) {
        if ((rc = eagle_trt_add_rms_norm(hid, nullptr, w[kInputNorm], pre, T, n, eps, threads))) return rc;
        hid = pre;
    }
    for (int64_t t = 0; t < T; ++t) {  // one row at a time: the two halves of x's row are written apart
        if ((rc = eagle_trt_add_rms_norm(const_cast<uint16_t*>(e) + t * n, nullptr, w[kInputNorm], x + t * 2 * n, 1,
                                         n, eps, 1)))
            return rc;
        if ((rc = eagle_trt_add_rms_norm(hid + t * n, nullptr, w[kHiddenNorm], x + t * 2 * n + n, 1, n, eps, 1)))
            return rc;
    }
    if ((rc = eagle_trt_amx_gemm(x, w[kQkv], qkv, T, 2 * n, qkv_w, threads))) return rc;
    if ((rc = eagle_trt_rope_qkv(qkv, nullptr, cos, sin, q, k_cache, head_stride, row_stride, v_cache, head_stride,
                                 row_stride, start, T, H, Hkv, D, threads)))
        return rc;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    if ((rc = eagle_trt_tree_attention(q, T * D, D, k_cache, head_stride, row_stride, v_cache, head_stride, row_stride,
                                       mask, att, static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(T),
                                       static_cast<int>(start + T), static_cast<int>(D), scale, 1, threads)))
        return rc;
    if ((rc = eagle_trt_amx_gemm(att, w[kO], o, T, H * D, n, threads))) return rc;
    std::memcpy(out, hidden, sizeof(uint16_t) * T * n);
    if ((rc = eagle_trt_add_rms_norm(out, o, w[kPostNorm], h, T, n, eps, threads))) return rc;
    if ((rc = eagle_trt_amx_gemm(h, w[kGateUp], gu, T, n, 2 * I, threads))) return rc;
    if ((rc = eagle_trt_silu_mul(gu, a, T, I, threads))) return rc;
    if ((rc = eagle_trt_amx_gemm(a, w[kDown], d, T, I, n, threads))) return rc;
    if ((rc = eagle_trt_add_rms_norm(out, d, w[kNorm], h, T, n, eps, threads))) return rc;
    const int64_t rows = last_only ? 1 : T;
    return eagle_trt_amx_gemm(h + (T - rows) * n, w[kLmHead], logits, rows, n, vocab, threads);
}

// For each of `rows` rows of bf16 logits [rows, V]: its k largest log-softmax values, largest first, and their
// indices (vals, idx: [rows, k]). Returns 0; -2 unless 1 <= k <= V.
int eagle_trt_top_logp(const uint16_t* logits, int64_t rows, int64_t V, int k, float* vals, int64_t* idx) {
    if (k < 1 || k > V) return -2;
    for (int64_t r = 0; r < rows; ++r) top_logp(logits + r * V, V, k, vals + r * k, idx + r * k);
    return 0;
}

}  // extern "C"
