#include "kernels/cpu/attention_backward.h"

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

void attention_forward_train(const float* q, const float* k, const float* v,
                             const std::vector<AttnSpan>& spans, const AttnShape& s, float* out,
                             float* lse) {
  const int64_t H = s.heads, KV = s.kv_heads, dqk = s.qk_dim, dv = s.v_dim;
  const int64_t group = H / KV;
  const int64_t items = static_cast<int64_t>(spans.size()) * H;
  int32_t max_len = 0;
  for (const auto& sp : spans) max_len = std::max(max_len, sp.len);
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(max_len));
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const AttnSpan& sp = spans[item / H];
      const int64_t h = item % H, kh = h / group;
      for (int64_t i = 0; i < sp.len; ++i) {
        const int64_t ti = sp.begin + i;
        const float* qi = q + (ti * H + h) * dqk;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = dot(qi, k + ((sp.begin + j) * KV + kh) * dqk, dqk) * s.scale;
          m = std::max(m, p[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - m);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        float* oi = out + (ti * H + h) * dv;
        std::memset(oi, 0, sizeof(float) * dv);
        for (int64_t j = 0; j <= i; ++j) axpy(p[j] * inv, v + ((sp.begin + j) * KV + kh) * dv, oi, dv);
        lse[ti * H + h] = m + std::log(sum);
      }
    }
  }
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
