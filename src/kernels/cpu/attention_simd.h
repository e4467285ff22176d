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
// 16 elements of a K/V row as f32 (the lanes past `m` zero): f32 rows are loaded, bf16
// rows widened exactly.
inline __m512 load_row16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_row16(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// Up to R query rows against 8 keys: s[r][c] = (q[r] . k[c]) * scale for the keys in
// store_mask. Each K vector is loaded once for all R rows (R = 3 holds 24 accumulators), and
// each dot is one FMA chain over 16-wide steps of dim, its lanes summed by the reduce8 tree,
// so a score is the same operations whatever rows it shares the block with.
template <int R, typename E>
inline void qk_rows8(const float* const* q, const E* const* k, int64_t dim, __m256 scale, __mmask8 store_mask,
                     float* const* s) {
  __m512 acc[R][8];  // fully unrolled loops keep these in registers
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t d0 = 0; d0 < dim; d0 += 16) {
    const __mmask16 m = tail_mask(dim - d0);
    __m512 qv[R];
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) qv[r] = _mm512_maskz_loadu_ps(m, q[r] + d0);
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m512 kv = load_row16(k[c] + d0, m);
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(qv[r], kv, acc[r][c]);
    }
  }
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
    _mm256_mask_storeu_ps(s[r], store_mask,
                          _mm256_mul_ps(reduce8(acc[r][0], acc[r][1], acc[r][2], acc[r][3], acc[r][4], acc[r][5],
                                                acc[r][6], acc[r][7]),
                                        scale));
}

// Scores of every query row of the block against n keys (rows kr + i * ks), written at key
// offset p0: s[row * ld + p0 + i] = (q_row . k_i) * scale. Query rows go 3 at a time, sharing
// each K load, and keys 8 at a time (eight independent chains, one reduce8 tree); a run's K rows
// (one page, or 64 positions) stay in L1 for all row groups. A short block repeats its last key,
// which only fills lanes that are not stored.
template <typename E>
inline void qk_scores(const QueryBlock& qb, const E* kr, int64_t ks, int64_t p0, int64_t n, float scale, float* s,
                      int64_t ld) {
  const __m256 sc = _mm256_set1_ps(scale);
  const int64_t rows = qb.tokens * qb.groups;
  for (int64_t r0 = 0; r0 < rows; r0 += 3) {
    const float* q[3] = {qb.q, qb.q, qb.q};
    float* out[3] = {s, s, s};  // entries past nr unused
    const int64_t nr = std::min<int64_t>(3, rows - r0);
    for (int64_t i = 0; i < nr; ++i) {
      const int64_t r = r0 + i;
      q[i] = qb.q + (r / qb.groups) * qb.token_stride + (r % qb.groups) * qb.dim;
      out[i] = s + r * ld + p0;
    }
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
      const int64_t nk = std::min<int64_t>(8, n - i0);
      const __mmask8 store = static_cast<__mmask8>((1u << nk) - 1);
      const E* k[8];
#pragma GCC unroll 8
      for (int64_t c = 0; c < 8; ++c) k[c] = kr + (i0 + std::min(c, nk - 1)) * ks;
      float* o[3] = {out[0] + i0, out[1] + i0, out[2] + i0};
      if (nr == 3) qk_rows8<3>(q, k, qb.dim, sc, store, o);
      else if (nr == 2) qk_rows8<2>(q, k, qb.dim, sc, store, o);
      else qk_rows8<1>(q, k, qb.dim, sc, store, o);
    }
  }
}
#else
template <typename E>
inline void qk_scores(const QueryBlock& qb, const E* kr, int64_t ks, int64_t p0, int64_t n, float scale, float* s,
                      int64_t ld) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < qb.tokens; ++j)
      for (int64_t g = 0; g < qb.groups; ++g)
        s[(j * qb.groups + g) * ld + p0 + i] = dot(qb.q + j * qb.token_stride + g * qb.dim, kr + i * ks, qb.dim) * scale;
}
#endif

}  // namespace astrai::kernels
