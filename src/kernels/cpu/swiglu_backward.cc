#include "kernels/cpu/swiglu_backward.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/vexp.h"

namespace astrai::kernels {

namespace {
constexpr int64_t kChunk = 4096;  // elements per parallel work item (16-lane aligned)
}

void swiglu_forward_train(const float* a, const float* b, int64_t n, float* h) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
#if defined(__AVX512F__)
    for (int64_t i = c * kChunk; i < end; i += 16) {
      const __mmask16 k = tail_mask(end - i);
      const __m512 av = _mm512_maskz_loadu_ps(k, a + i);
      const __m512 silu = _mm512_mul_ps(av, sigmoid16(av));
      _mm512_mask_storeu_ps(h + i, k, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(k, b + i)));
    }
#else
    for (int64_t i = c * kChunk; i < end; ++i) h[i] = a[i] / (1.0f + exp_approx(-a[i])) * b[i];
#endif
  }
}

void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da, float* db) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = c * kChunk; i < end; i += 16) {
      const __mmask16 k = tail_mask(end - i);
      const __m512 av = _mm512_maskz_loadu_ps(k, a + i), bv = _mm512_maskz_loadu_ps(k, b + i);
      const __m512 g = _mm512_maskz_loadu_ps(k, dh + i);
      const __m512 sg = sigmoid16(av);
      // da = g * b * sg * (1 + a * (1 - sg)), db = g * a * sg
      const __m512 t = _mm512_fmadd_ps(av, _mm512_sub_ps(one, sg), one);
      _mm512_mask_storeu_ps(da + i, k, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(g, bv), sg), t));
      _mm512_mask_storeu_ps(db + i, k, _mm512_mul_ps(g, _mm512_mul_ps(av, sg)));
    }
#else
    for (int64_t i = c * kChunk; i < end; ++i) {
      const float sg = 1.0f / (1.0f + exp_approx(-a[i]));
      da[i] = dh[i] * b[i] * sg * (1.0f + a[i] * (1.0f - sg));
      db[i] = dh[i] * a[i] * sg;
    }
#endif
  }
}

void sigmoid_forward(const float* x, int64_t n, float* g) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

}  // namespace astrai::kernels
