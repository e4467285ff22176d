// The score loop shared by the attention kernels (attention.cc, attention_backward.cc):
// dot products of query rows with key rows, 8 keys at a time, reduced by the reduce8 tree.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/vec_math.h"

#if defined(__AVX512F__)
#include "kernels/cpu/exp512.h"
#include "kernels/cpu/reduce8.h"
#endif

namespace astrai::kernels {

// The query rows of one work item: `tokens` consecutive tokens x `groups` query heads of one
// kv head; row (j, g) is q + j * token_stride + g * dim, its scores s + (j * groups + g) * ld.
struct QueryBlock {
  const float* q;
  int64_t tokens, groups, token_stride, dim;
};

#if defined(__AVX512F__)
// Scores of every query row of the block against n keys (rows kr + i * ks), written at key
// offset p0: s[row * ld + p0 + i] = (q_row . k_i) * scale. Each dot is one FMA chain over
// 16-wide steps of dim (the tail masked), its lanes summed by the reduce8 tree; keys go 8 at
// a time so the eight chains overlap and one tree reduces all eight, and the 8 K rows stay in
// L1 for all query rows. A short block repeats its last row, which only fills lanes that are
// not stored.
inline void qk_scores(const QueryBlock& qb, const float* kr, int64_t ks, int64_t p0, int64_t n, float scale, float* s,
                      int64_t ld) {
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int64_t nk = std::min<int64_t>(8, n - i0);
    const float* row[8];
#pragma GCC unroll 8
    for (int64_t c = 0; c < 8; ++c) row[c] = kr + (i0 + std::min(c, nk - 1)) * ks;
    for (int64_t j = 0; j < qb.tokens; ++j) {
      for (int64_t g = 0; g < qb.groups; ++g) {
        const float* qg = qb.q + j * qb.token_stride + g * qb.dim;
        __m512 acc[8];  // fully unrolled loops keep these in registers
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) acc[c] = _mm512_setzero_ps();
        for (int64_t d0 = 0; d0 < qb.dim; d0 += 16) {
          const __mmask16 m = tail_mask(qb.dim - d0);
          const __m512 qv = _mm512_maskz_loadu_ps(m, qg + d0);
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) acc[c] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, row[c] + d0), acc[c]);
        }
        _mm256_mask_storeu_ps(s + (j * qb.groups + g) * ld + p0 + i0, static_cast<__mmask8>((1u << nk) - 1),
                              _mm256_mul_ps(reduce8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]), sc));
      }
    }
  }
}
#else
inline void qk_scores(const QueryBlock& qb, const float* kr, int64_t ks, int64_t p0, int64_t n, float scale, float* s,
                      int64_t ld) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < qb.tokens; ++j)
      for (int64_t g = 0; g < qb.groups; ++g)
        s[(j * qb.groups + g) * ld + p0 + i] = dot(qb.q + j * qb.token_stride + g * qb.dim, kr + i * ks, qb.dim) * scale;
}
#endif

}  // namespace astrai::kernels
