#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>

#include "kernels/cpu/vec_math.h"

namespace astrai::kernels {

namespace {

// Calls fn(first_position, count, k_rows, v_rows) for consecutive runs of key positions
// [0, len) whose rows are contiguous (stride num_kv_heads * dim), in increasing order.
template <typename Fn>
inline void for_each_kv_run(const KvSource& kv, const AttentionSeq& s, int64_t kv_head, const AttentionDims& d,
                            int64_t len, Fn&& fn) {
  const int64_t k_stride = d.num_kv_heads * d.qk_dim;
  const int64_t v_stride = d.num_kv_heads * d.v_dim;
  if (kv.page_size == 0) {
    fn(int64_t{0}, len, kv.k + s.token_begin * k_stride + kv_head * d.qk_dim,
       kv.v + s.token_begin * v_stride + kv_head * d.v_dim);
    return;
  }
  const int64_t ps = kv.page_size;
  for (int64_t t0 = 0; t0 < len; t0 += ps) {
    const int64_t page = s.page_table[t0 / ps];
    const int64_t n = std::min(ps, len - t0);
    fn(t0, n, kv.k + page * ps * k_stride + kv_head * d.qk_dim, kv.v + page * ps * v_stride + kv_head * d.v_dim);
  }
}

}  // namespace

void attention(const float* q, const KvSource& kv, const AttentionSeq* seqs, int64_t num_seqs,
               const int32_t* token_seq, int64_t num_tokens, const AttentionDims& d, float* out,
               AttentionScratch& scratch) {
  const int64_t groups = d.num_heads / d.num_kv_heads;
  int64_t max_len = 0;
  for (int64_t s = 0; s < num_seqs; ++s) max_len = std::max<int64_t>(max_len, seqs[s].context_len + seqs[s].num_tokens);
  // Per thread: scores [groups, max_len] then accumulators [groups, v_dim].
  const int64_t per_thread = groups * max_len + groups * d.v_dim + kLanes;
  const int threads = omp_get_max_threads();
  if (static_cast<int64_t>(scratch.buf.size()) < per_thread * threads)
    scratch.buf.resize(static_cast<size_t>(per_thread * threads));
  const int64_t items = num_tokens * d.num_kv_heads;
  const int64_t k_stride = d.num_kv_heads * d.qk_dim;
  const int64_t v_stride = d.num_kv_heads * d.v_dim;
  (void)k_stride;

#pragma omp parallel
  {
    float* scores = scratch.buf.data() + per_thread * omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item / d.num_kv_heads;
      const int64_t kvh = item % d.num_kv_heads;
      if (token_seq[t] < 0) continue;
      const AttentionSeq& s = seqs[token_seq[t]];
      const int64_t len = s.context_len + (t - s.token_begin) + 1;  // causal: positions [0, len)
      float* acc = scores + groups * max_len;
      const float* qh = q + (t * d.num_heads + kvh * groups) * d.qk_dim;

      for_each_kv_run(kv, s, kvh, d, len, [&](int64_t p0, int64_t n, const float* kr, const float*) {
        for (int64_t i = 0; i < n; ++i) {
          const float* krow = kr + i * k_stride;
          for (int64_t g = 0; g < groups; ++g) scores[g * max_len + p0 + i] = dot(qh + g * d.qk_dim, krow, d.qk_dim) * d.scale;
        }
      });
      for (int64_t g = 0; g < groups; ++g) {
        float* sg = scores + g * max_len;
        const float m = max_value(sg, len);
        exp_shifted(sg, m, len, sg);
        const float inv = 1.0f / sum(sg, len);
        for (int64_t i = 0; i < len; ++i) sg[i] *= inv;
        std::fill(acc + g * d.v_dim, acc + (g + 1) * d.v_dim, 0.0f);
      }
      for_each_kv_run(kv, s, kvh, d, len, [&](int64_t p0, int64_t n, const float*, const float* vr) {
        for (int64_t i = 0; i < n; ++i) {
          const float* vrow = vr + i * v_stride;
          for (int64_t g = 0; g < groups; ++g) {
            const float p = scores[g * max_len + p0 + i];
            float* a = acc + g * d.v_dim;
            for (int64_t e = 0; e < d.v_dim; ++e) a[e] += p * vrow[e];
          }
        }
      });
      for (int64_t g = 0; g < groups; ++g)
        std::copy(acc + g * d.v_dim, acc + (g + 1) * d.v_dim, out + (t * d.num_heads + kvh * groups + g) * d.v_dim);
    }
  }
}

}  // namespace astrai::kernels
