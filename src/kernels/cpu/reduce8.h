// reduce8 (v4 only): the 16 lanes of each of 8 vectors summed by the contract's tree, 8 results
// at once (15 shuffles and 15 adds for 8 sums, where 8 separate trees take 56 operations).
// Lane i + lane i+8, then i + i+4, i + i+2, i + i+1: the order vsum (simd.h) uses on every level.
#pragma once

#if defined(ASTRAI_ISA_V4)

#include <immintrin.h>

#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

ASTRAI_KERNELS_BEGIN

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

ASTRAI_KERNELS_END

#endif
