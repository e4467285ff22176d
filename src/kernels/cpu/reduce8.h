// reduce8 (v4 and v3): the 16 lanes of each of 8 vectors summed by the contract's tree, 8
// results at once (v4: 15 shuffles and 15 adds for 8 sums, where 8 separate trees take 56
// operations). Lane i + lane i+8, then i + i+4, i + i+2, i + i+1: the order vsum (simd.h) uses
// on every level.
#pragma once

#if defined(ASTRAI_ISA_V4) || defined(ASTRAI_ISA_V3)

#include <immintrin.h>

#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

ASTRAI_KERNELS_BEGIN

#if defined(ASTRAI_ISA_V4)
// out[c] = tree sum of the 16 lanes of v[c], c < 8. Lanes of different v never mix, so each
// output's value does not depend on what the other seven inputs hold.
// Takes the vectors by value: a caller's accumulator array whose address reached this
// function would be kept in memory, with a store per FMA in the caller's loop.
inline __m256 reduce8(__m512 v0, __m512 v1, __m512 v2, __m512 v3, __m512 v4, __m512 v5, __m512 v6, __m512 v7) {
  const __m512 v[8] = {v0, v1, v2, v3, v4, v5, v6, v7};
  __m512 s[4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {  // lane i + lane i+8: [v0 8 sums | v1 8 sums]
    const __m512 lo = _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 hi = _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2));
    s[p] = _mm512_add_ps(lo, hi);
  }
  __m512 r[2];
#pragma GCC unroll 2
  for (int p = 0; p < 2; ++p) {  // i + i+4: blocks [A4 B4 C4 D4] / [E4 F4 G4 H4]
    const __m512 t = _mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 u = _mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1));
    r[p] = _mm512_add_ps(t, u);
  }
  // i + i+2: per 128-bit block [X(0+2) X(1+3) Y(0+2) Y(1+3)], X = A..D, Y = E..H.
  const __m512 q = _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 2, 3, 2)));
  // i + i+1.
  const __m512 f = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, f));
}
#endif

#if defined(ASTRAI_ISA_V3)
// v3: out[c] = tree sum of the 8 lanes of y[c], c < 8, where y[c] already holds lane i + lane
// i+8 of a Vec16 (its lo + hi): i + i+4, i + i+2, i + i+1 as tree8 (simd.h) adds them, 8 sums
// at once (12 shuffles and 7 adds + hadd, where 8 tree8 calls take 48 operations). Lanes of
// different y never mix. By value, as the v4 version.
inline __m256 reduce8_halves(__m256 y0, __m256 y1, __m256 y2, __m256 y3, __m256 y4, __m256 y5, __m256 y6, __m256 y7) {
  const __m256 y[8] = {y0, y1, y2, y3, y4, y5, y6, y7};
  __m256 s[4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p)  // i + i+4: [y(2p) 4 sums | y(2p+1) 4 sums]
    s[p] = _mm256_add_ps(_mm256_permute2f128_ps(y[2 * p], y[2 * p + 1], 0x20),
                         _mm256_permute2f128_ps(y[2 * p], y[2 * p + 1], 0x31));
  __m256 r[2];
#pragma GCC unroll 2
  for (int p = 0; p < 2; ++p)  // i + i+2: [X(0+2) X(1+3) Z(0+2) Z(1+3) | ...], X = y(4p), Z = y(4p+2)
    r[p] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // i + i+1: [y0 y2 y4 y6 | y1 y3 y5 y7].
  const __m256 f = _mm256_hadd_ps(r[0], r[1]);
  return _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

ASTRAI_KERNELS_END

#endif
