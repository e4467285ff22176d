#include "kernels/cpu/attention_backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/level_table.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

namespace {

// Query rows of one head taken together: their scores share K and V loads (qk_scores' tiles),
// and each key's K, dk and dv rows are read and written once for all of them. 8 measured best of
// 2, 4, 8 and 16 (a 1024-token document, v3 and v4), 2-2.7x the rows one at a time.
constexpr int64_t kRows = 8;

// The rows i0 .. i0 + nb - 1 of query head h (row b sees keys [0, i0 + b + 1)): p[b] the
// softmax probabilities (recomputed from the saved log-sum-exp), ds[b] d(loss)/d(score).
struct RowBlock {
  int64_t i0, nb;
  const float* q[kRows];
  const float* dout[kRows];
  float* dq[kRows];
  float* p[kRows];
  float* ds[kRows];
};

// dq[b] = sum_j ds[b][j] k_j, dk_j += ds[b][j] q[b] and dv_j += p[b][j] dout[b] for every key
// j of the block, the rows in increasing order under each j: per element the same products and
// sums in the same order as one row at a time (j increasing for dq; rows, i.e. i, increasing
// for dk and dv), so the bits do not depend on the block. Each update is a product, then a sum,
// as the rows' axpy was (the kernels build with -ffp-contract=off: no fused multiply-add on
// any level). Key j's K row and its dk and dv partial sums stay in registers, 16 dims at a
// time, while the block's rows pass.
void accumulate(const RowBlock& rb, const float* k0, float* dk0, float* dv0, int64_t ks, int64_t vs, int64_t dqk,
                int64_t dv) {
  for (int64_t b = 0; b < rb.nb; ++b) std::memset(rb.dq[b], 0, sizeof(float) * dqk);
  const int64_t n_max = rb.i0 + rb.nb;
  for (int64_t j = 0; j < n_max; ++j) {
    const int64_t b0 = std::max<int64_t>(0, j - rb.i0);  // the rows that see key j
    const float* kj = k0 + j * ks;
    float* dkj = dk0 + j * ks;
    float* dvj = dv0 + j * vs;
    for (int64_t d0 = 0; d0 < dqk; d0 += kLanes) {
      const int64_t n = dqk - d0;  // the last piece may be short (vload_n / vstore_n)
      const Vec16 kv = vload_n(kj + d0, n);
      Vec16 dk = vload_n(dkj + d0, n);
      for (int64_t b = b0; b < rb.nb; ++b) {
        const Vec16 a(rb.ds[b][j]);
        vstore_n(rb.dq[b] + d0, vload_n(rb.dq[b] + d0, n) + a * kv, n);
        dk = dk + a * vload_n(rb.q[b] + d0, n);
      }
      vstore_n(dkj + d0, dk, n);
    }
    for (int64_t d0 = 0; d0 < dv; d0 += kLanes) {
      const int64_t n = dv - d0;
      Vec16 acc = vload_n(dvj + d0, n);
      for (int64_t b = b0; b < rb.nb; ++b) acc = acc + Vec16(rb.p[b][j]) * vload_n(rb.dout[b] + d0, n);
      vstore_n(dvj + d0, acc, n);
    }
  }
}

}  // namespace

void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, const std::vector<AttnSpan>& spans,
                        const AttnShape& s, float* dq, float* dk, float* dv_out) {
  const int64_t H = s.heads, KV = s.kv_heads, dqk = s.qk_dim, dv = s.v_dim;
  const int64_t group = H / KV;
  int32_t max_len = 0;
  for (const auto& sp : spans) max_len = std::max(max_len, sp.len);
  // One work item per (document, kv head): all query heads that write into the same dk/dv
  // rows are processed by one thread, so there are no races and the sum order is fixed.
  const int64_t items = static_cast<int64_t>(spans.size()) * KV;
#pragma omp parallel
  {
    // Per block row: probabilities and score gradients for the keys it sees (kept by the
    // thread from call to call, grown when a longer document comes).
    thread_local std::vector<float> p, ds;
    if (p.size() < static_cast<size_t>(kRows * max_len)) {
      p.resize(static_cast<size_t>(kRows * max_len));
      ds.resize(p.size());
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const AttnSpan& sp = spans[item / KV];
      const int64_t kh = item % KV;
      const float* k0 = k + (sp.begin * KV + kh) * dqk;
      const float* v0 = v + (sp.begin * KV + kh) * dv;
      float* dk0 = dk + (sp.begin * KV + kh) * dqk;
      float* dv0 = dv_out + (sp.begin * KV + kh) * dv;
      for (int64_t j = 0; j < sp.len; ++j) {
        std::memset(dk0 + j * KV * dqk, 0, sizeof(float) * dqk);
        std::memset(dv0 + j * KV * dv, 0, sizeof(float) * dv);
      }
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < sp.len; i0 += kRows) {
          RowBlock rb{i0, std::min<int64_t>(kRows, sp.len - i0), {}, {}, {}, {}, {}};
          for (int64_t b = 0; b < rb.nb; ++b) {
            const int64_t ti = sp.begin + i0 + b;
            rb.q[b] = q + (ti * H + h) * dqk;
            rb.dout[b] = dout + (ti * H + h) * dv;
            rb.dq[b] = dq + (ti * H + h) * dqk;
            rb.p[b] = p.data() + b * max_len;
            rb.ds[b] = ds.data() + b * max_len;
          }
          // Scores and do . v of every row against the block's last row's keys (a row ignores
          // the keys past its own; each score's bits do not depend on the rows beside it).
          const int64_t n_max = i0 + rb.nb;
          qk_scores(QueryRows{rb.q, rb.nb, dqk}, k0, KV * dqk, 0, n_max, s.scale, p.data(), max_len);
          qk_scores(QueryRows{rb.dout, rb.nb, dv}, v0, KV * dv, 0, n_max, 1.0f, ds.data(), max_len);
          for (int64_t b = 0; b < rb.nb; ++b) {
            const int64_t ti = sp.begin + i0 + b, n = i0 + b + 1;
            const float di = dot(rb.dout[b], out + (ti * H + h) * dv, dv);
            exp_affine(rb.p[b], lse[ti * H + h], 1.0f, 0.0f, n, rb.p[b]);  // p = exp(score - lse)
            for (int64_t j = 0; j < n; ++j) rb.ds[b][j] = rb.p[b][j] * (rb.ds[b][j] - di) * s.scale;
          }
          accumulate(rb, k0, dk0, dv0, KV * dqk, KV * dv, dqk, dv);
        }
      }
    }
  }
}

void fill_attention_backward(KernelTable& t) { t.attention_backward = &attention_backward; }

ASTRAI_KERNELS_END
