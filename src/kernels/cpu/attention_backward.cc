#include "kernels/cpu/attention_backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/level_table.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

namespace {

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
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
    // Per row i: p[j] = softmax probabilities (recomputed from the saved log-sum-exp),
    // ds[j] = d(loss)/d(score) for the keys j <= i, scores and dots 8 keys at a time.
    std::vector<float> p(static_cast<size_t>(max_len)), ds(static_cast<size_t>(max_len));
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const AttnSpan& sp = spans[item / KV];
      const int64_t kh = item % KV;
      const float* k0 = k + (sp.begin * KV + kh) * dqk;
      const float* v0 = v + (sp.begin * KV + kh) * dv;
      for (int64_t j = 0; j < sp.len; ++j) {
        std::memset(dk + ((sp.begin + j) * KV + kh) * dqk, 0, sizeof(float) * dqk);
        std::memset(dv_out + ((sp.begin + j) * KV + kh) * dv, 0, sizeof(float) * dv);
      }
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        for (int64_t i = 0; i < sp.len; ++i) {
          const int64_t ti = sp.begin + i, n = i + 1;
          const float* qi = q + (ti * H + h) * dqk;
          const float* doi = dout + (ti * H + h) * dv;
          const float di = dot(doi, out + (ti * H + h) * dv, dv);
          qk_scores(QueryRows{&qi, 1, dqk}, k0, KV * dqk, 0, n, s.scale, p.data(), 0);
          exp_affine(p.data(), lse[ti * H + h], 1.0f, 0.0f, n, p.data());  // p = exp(score - lse)
          qk_scores(QueryRows{&doi, 1, dv}, v0, KV * dv, 0, n, 1.0f, ds.data(), 0);  // dp = do . v
          for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - di) * s.scale;
          float* dqi = dq + (ti * H + h) * dqk;
          std::memset(dqi, 0, sizeof(float) * dqk);
          for (int64_t j = 0; j < n; ++j) {
            const int64_t tj = sp.begin + j;
            axpy(ds[j], k0 + j * KV * dqk, dqi, dqk);
            axpy(ds[j], qi, dk + (tj * KV + kh) * dqk, dqk);
            axpy(p[j], doi, dv_out + (tj * KV + kh) * dv, dv);
          }
        }
      }
    }
  }
}

void fill_attention_backward(KernelTable& t) { t.attention_backward = &attention_backward; }

ASTRAI_KERNELS_END
