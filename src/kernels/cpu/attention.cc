#include "kernels/cpu/attention.h"

// GCC 12's AVX-512 headers (_mm512_undefined_ps) trip the uninitialized warnings.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <omp.h>

#include <algorithm>

#include "kernels/cpu/vec_math.h"

#if defined(__AVX512F__)
#include "kernels/cpu/reduce8.h"
#endif

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace astrai::kernels {

namespace {

// The hot loops, one version per build. Each is a fixed sequence of operations for a given
// length n, so results never depend on the batch, the chunking or pointer alignment.
#if defined(__AVX512F__)
inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << remaining) - 1);
}

// Scores of `groups` query heads (q rows dim apart) against n keys (rows kr + i * ks):
// s[g * ld + i] = (q_g . k_i) * scale. Each dot is one FMA chain over 16-wide steps of dim
// (the tail masked), its lanes summed by the reduce8 tree; keys go 8 at a time so the eight
// chains overlap and one tree reduces all eight. A short block repeats its last row, which
// only fills lanes that are not stored: a score never depends on n or its neighbours.
inline void qk_scores(const float* q, int64_t groups, int64_t dim, const float* kr, int64_t ks, int64_t n, float scale,
                      float* s, int64_t ld) {
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int64_t nk = std::min<int64_t>(8, n - i0);
    const float* row[8];
    for (int64_t c = 0; c < 8; ++c) row[c] = kr + (i0 + std::min(c, nk - 1)) * ks;
    for (int64_t g = 0; g < groups; ++g) {
      const float* qg = q + g * dim;
      __m512 acc[8];
      for (auto& a : acc) a = _mm512_setzero_ps();
      for (int64_t d0 = 0; d0 < dim; d0 += 16) {
        const __mmask16 m = tail_mask(dim - d0);
        const __m512 qv = _mm512_maskz_loadu_ps(m, qg + d0);
        for (int c = 0; c < 8; ++c) acc[c] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, row[c] + d0), acc[c]);
      }
      _mm256_mask_storeu_ps(s + g * ld + i0, static_cast<__mmask8>((1u << nk) - 1), _mm256_mul_ps(reduce8(acc), sc));
    }
  }
}

inline void att_axpy(float p, const float* x, int64_t n, float* y) {
  const __m512 pv = _mm512_set1_ps(p);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// s[i] = exp(s[i] - max(s)) / sum, in place.
inline void att_softmax(float* s, int64_t n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, tail_mask(n - i), s + i));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), m));
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    _mm512_mask_storeu_ps(s + i, k, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(acc));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(s + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + i), inv));
  }
}

// Weighted sum of V rows, accumulators in registers: key position j (absolute, p0 + i)
// goes to the even or odd set by its parity, so consecutive keys form independent FMA
// chains; the two sets are added at the end. Depends only on the positions, never on how
// they are split into runs.
template <int NV>
inline void pv_one(float p, const float* row, __mmask16 last, __m512* acc) {
  const __m512 pv = _mm512_set1_ps(p);
  for (int j = 0; j < NV - 1; ++j) acc[j] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(row + 16 * j), acc[j]);
  acc[NV - 1] = _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(last, row + 16 * (NV - 1)), acc[NV - 1]);
}

template <int NV>
inline void pv_run(const float* p, int64_t p0, int64_t n, const float* vr, int64_t stride, __mmask16 last,
                   __m512* even, __m512* odd) {
  int64_t i = 0;
  if (n > 0 && (p0 & 1)) {
    pv_one<NV>(p[0], vr, last, odd);
    i = 1;
  }
  for (; i + 1 < n; i += 2) {
    pv_one<NV>(p[i], vr + i * stride, last, even);
    pv_one<NV>(p[i + 1], vr + (i + 1) * stride, last, odd);
  }
  if (i < n) pv_one<NV>(p[i], vr + i * stride, last, even);
}

// Weighted sum of V rows for one query head, v_dim <= 128. Returns false if v_dim is wider.
template <typename ForEachRun>
inline bool pv_registers(const float* p, int64_t v_dim, float* out, ForEachRun&& for_each_run) {
  const int nv = static_cast<int>((v_dim + 15) / 16);
  if (nv > 8) return false;
  const __mmask16 last = tail_mask(v_dim - 16 * (nv - 1));
  __m512 even[8], odd[8];
  for (int j = 0; j < 8; ++j) even[j] = odd[j] = _mm512_setzero_ps();
  for_each_run([&](int64_t p0, int64_t n, const float* vr, int64_t stride) {
    switch (nv) {
      case 1: pv_run<1>(p + p0, p0, n, vr, stride, last, even, odd); break;
      case 2: pv_run<2>(p + p0, p0, n, vr, stride, last, even, odd); break;
      case 3: pv_run<3>(p + p0, p0, n, vr, stride, last, even, odd); break;
      case 4: pv_run<4>(p + p0, p0, n, vr, stride, last, even, odd); break;
      case 5: pv_run<5>(p + p0, p0, n, vr, stride, last, even, odd); break;
      case 6: pv_run<6>(p + p0, p0, n, vr, stride, last, even, odd); break;
      case 7: pv_run<7>(p + p0, p0, n, vr, stride, last, even, odd); break;
      default: pv_run<8>(p + p0, p0, n, vr, stride, last, even, odd); break;
    }
  });
  for (int j = 0; j < nv; ++j)
    _mm512_mask_storeu_ps(out + 16 * j, j == nv - 1 ? last : 0xffff, _mm512_add_ps(even[j], odd[j]));
  return true;
}
#else
template <typename ForEachRun>
inline bool pv_registers(const float*, int64_t, float*, ForEachRun&&) { return false; }
inline void qk_scores(const float* q, int64_t groups, int64_t dim, const float* kr, int64_t ks, int64_t n, float scale,
                      float* s, int64_t ld) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t g = 0; g < groups; ++g) s[g * ld + i] = dot(q + g * dim, kr + i * ks, dim) * scale;
}
inline void att_axpy(float p, const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += p * x[i];
}
inline void att_softmax(float* s, int64_t n) {
  const float m = max_value(s, n);
  exp_shifted(s, m, n, s);
  const float inv = 1.0f / sum(s, n);
  for (int64_t i = 0; i < n; ++i) s[i] *= inv;
}
#endif

// Calls fn(first_position, count, k_rows, v_rows, k_stride, v_stride) for consecutive runs
// of key positions [0, len) whose rows for kv_head are evenly spaced, in increasing order.
// Paged mode: one run per page, its rows contiguous (head-major pages: a 16-slot page of a
// 64-dim head is one 4 KiB block, which the hardware prefetchers stream; software prefetch
// of the next page measured no gain).
template <typename Fn>
inline void for_each_kv_run(const KvSource& kv, const AttentionSeq& s, int64_t kv_head, const AttentionDims& d,
                            int64_t len, Fn&& fn) {
  if (kv.page_size == 0) {
    const int64_t k_stride = d.num_kv_heads * d.qk_dim, v_stride = d.num_kv_heads * d.v_dim;
    fn(int64_t{0}, len, kv.k + s.token_begin * k_stride + kv_head * d.qk_dim,
       kv.v + s.token_begin * v_stride + kv_head * d.v_dim, k_stride, v_stride);
    return;
  }
  const int64_t ps = kv.page_size;
  const int64_t k_page = d.num_kv_heads * ps * d.qk_dim, v_page = d.num_kv_heads * ps * d.v_dim;
  for (int64_t t0 = 0; t0 < len; t0 += ps) {
    const int64_t page = s.page_table[t0 / ps];
    fn(t0, std::min(ps, len - t0), kv.k + page * k_page + kv_head * ps * d.qk_dim,
       kv.v + page * v_page + kv_head * ps * d.v_dim, d.qk_dim, d.v_dim);
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

#pragma omp parallel
  {
    float* scores = scratch.buf.data() + per_thread * omp_get_thread_num();
    // Round-robin items: causal rows grow in cost along the sequence, so contiguous blocks
    // would leave one thread with most of the work. Results do not depend on the schedule.
#pragma omp for schedule(static, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item / d.num_kv_heads;
      const int64_t kvh = item % d.num_kv_heads;
      if (token_seq[t] < 0) continue;
      const AttentionSeq& s = seqs[token_seq[t]];
      const int64_t len = s.context_len + (t - s.token_begin) + 1;  // causal: positions [0, len)
      float* acc = scores + groups * max_len;
      const float* qh = q + (t * d.num_heads + kvh * groups) * d.qk_dim;

      for_each_kv_run(kv, s, kvh, d, len,
                      [&](int64_t p0, int64_t n, const float* kr, const float*, int64_t k_stride, int64_t) {
        qk_scores(qh, groups, d.qk_dim, kr, k_stride, n, d.scale, scores + p0, max_len);
      });
      for (int64_t g = 0; g < groups; ++g) att_softmax(scores + g * max_len, len);
      bool done = true;
      for (int64_t g = 0; g < groups && done; ++g) {
        float* o = out + (t * d.num_heads + kvh * groups + g) * d.v_dim;
        done = pv_registers(scores + g * max_len, d.v_dim, o, [&](auto&& run) {
          for_each_kv_run(kv, s, kvh, d, len,
                          [&](int64_t p0, int64_t n, const float*, const float* vr, int64_t, int64_t v_stride) {
                            run(p0, n, vr, v_stride);
                          });
        });
      }
      if (done) continue;
      for (int64_t g = 0; g < groups; ++g) std::fill(acc + g * d.v_dim, acc + (g + 1) * d.v_dim, 0.0f);
      for_each_kv_run(kv, s, kvh, d, len,
                      [&](int64_t p0, int64_t n, const float*, const float* vr, int64_t, int64_t v_stride) {
        for (int64_t i = 0; i < n; ++i) {
          const float* vrow = vr + i * v_stride;
          for (int64_t g = 0; g < groups; ++g) {
            att_axpy(scores[g * max_len + p0 + i], vrow, d.v_dim, acc + g * d.v_dim);
          }
        }
      });
      for (int64_t g = 0; g < groups; ++g)
        std::copy(acc + g * d.v_dim, acc + (g + 1) * d.v_dim, out + (t * d.num_heads + kvh * groups + g) * d.v_dim);
    }
  }
}

}  // namespace astrai::kernels
