#include "kernels/cpu/attention_backward.h"

#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace astrai::kernels {

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace

// The inference kernel (attention.cc) over the batch's own K/V, one sequence per document:
// the same blocked, vectorised loops, plus the log-sum-exp of every row.
void attention_forward_train(const float* q, const float* k, const float* v,
                             const std::vector<AttnSpan>& spans, const AttnShape& s, float* out,
                             float* lse) {
  thread_local std::vector<AttentionSeq> seqs;
  thread_local AttentionScratch scratch;
  seqs.clear();
  for (const AttnSpan& sp : spans) seqs.push_back(AttentionSeq{sp.begin, sp.len, 0, nullptr});
  const AttentionDims d{s.heads, s.kv_heads, s.qk_dim, s.v_dim, s.scale};
  attention(q, KvSource{k, v, 0}, seqs.data(), static_cast<int64_t>(seqs.size()), d, out, scratch, lse);
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, const std::vector<AttnSpan>& spans,
                        const AttnShape& s, float* dq, float* dk, float* dv_out) {
  const int64_t H = s.heads, KV = s.kv_heads, dqk = s.qk_dim, dv = s.v_dim;
  const int64_t group = H / KV;
  // One work item per (document, kv head): all query heads that write into the same dk/dv
  // rows are processed by one thread, so there are no races and the sum order is fixed.
  const int64_t items = static_cast<int64_t>(spans.size()) * KV;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < items; ++item) {
    const AttnSpan& sp = spans[item / KV];
    const int64_t kh = item % KV;
    for (int64_t j = 0; j < sp.len; ++j) {
      std::memset(dk + ((sp.begin + j) * KV + kh) * dqk, 0, sizeof(float) * dqk);
      std::memset(dv_out + ((sp.begin + j) * KV + kh) * dv, 0, sizeof(float) * dv);
    }
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      for (int64_t i = 0; i < sp.len; ++i) {
        const int64_t ti = sp.begin + i;
        const float* qi = q + (ti * H + h) * dqk;
        const float* doi = dout + (ti * H + h) * dv;
        const float di = dot(doi, out + (ti * H + h) * dv, dv);
        const float l = lse[ti * H + h];
        float* dqi = dq + (ti * H + h) * dqk;
        std::memset(dqi, 0, sizeof(float) * dqk);
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t tj = sp.begin + j;
          const float* kj = k + (tj * KV + kh) * dqk;
          const float* vj = v + (tj * KV + kh) * dv;
          const float p = std::exp(dot(qi, kj, dqk) * s.scale - l);
          const float dp = dot(doi, vj, dv);
          const float ds = p * (dp - di) * s.scale;
          axpy(ds, kj, dqi, dqk);
          axpy(ds, qi, dk + (tj * KV + kh) * dqk, dqk);
          axpy(p, doi, dv_out + (tj * KV + kh) * dv, dv);
        }
      }
    }
  }
}

}  // namespace astrai::kernels
