// Vectorised exponentials over arrays, for the losses and activations of training: exp512
// (exp512.h) on 16 lanes with AVX-512, exp_approx (vec_math.h) otherwise. Each element's value
// depends only on its inputs; sums use 16 lane partial sums reduced by a fixed tree.
#pragma once

#include <cstdint>

#include "kernels/cpu/vec_math.h"

#if defined(__AVX512F__)
#include "kernels/cpu/exp512.h"
#endif

namespace astrai::kernels {

#if defined(__AVX512F__)
// max of x[0, n), n >= 1.
inline float vmax(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, tail_mask(n - i), x + i));
  return _mm512_reduce_max_ps(m);
}

// Σ exp(x[i] - shift).
inline float exp_shift_sum(const float* x, float shift, int64_t n) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s))));
  }
  return _mm512_reduce_add_ps(acc);
}

// y[i] = a * exp(x[i] - shift) + b.
inline void exp_affine(const float* x, float shift, float a, float b, int64_t n, float* y) {
  const __m512 s = _mm512_set1_ps(shift), av = _mm512_set1_ps(a), bv = _mm512_set1_ps(b);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s));
    _mm512_mask_storeu_ps(y + i, k, _mm512_fmadd_ps(av, e, bv));
  }
}

// y[i] = 1 / (1 + exp(-x[i])) for 16 lanes.
inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
#else
inline float vmax(const float* x, int64_t n) { return max_value(x, n); }
inline float exp_shift_sum(const float* x, float shift, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += exp_approx(x[i] - shift);
  return s;
}
inline void exp_affine(const float* x, float shift, float a, float b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a * exp_approx(x[i] - shift) + b;
}
#endif

}  // namespace astrai::kernels
