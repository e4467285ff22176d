#include "kernels/cpu/activation.h"

#include "kernels/cpu/vec_math.h"

#if defined(__AVX512F__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels/cpu/exp512.h"
#endif

namespace astrai::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 16;
constexpr int64_t kChunk = 4096;
}  // namespace

// Chunks of fixed size keep the per-element math identical whatever the thread count.
void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = c * kChunk + kChunk < n ? c * kChunk + kChunk : n;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = c * kChunk; i < end; i += 16) {  // every element by the same vector ops
      const __mmask16 m = end - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (end - i)) - 1);
      const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
      const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
      const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
      _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
    }
#else
    for (int64_t i = c * kChunk; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + exp_approx(-g)) * up[i];
    }
#endif
  }
}

void mul_sigmoid(float* x, const float* g, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = c * kChunk + kChunk < n ? c * kChunk + kChunk : n;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = c * kChunk; i < end; i += 16) {
      const __mmask16 m = end - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (end - i)) - 1);
      const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_maskz_loadu_ps(m, g + i)));
      const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, e));
      _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sig));
    }
#else
    for (int64_t i = c * kChunk; i < end; ++i) x[i] = x[i] * (1.0f / (1.0f + exp_approx(-g[i])));
#endif
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = c * kChunk + kChunk < n ? c * kChunk + kChunk : n;
    for (int64_t i = c * kChunk; i < end; ++i) y[i] += x[i];
  }
}

}  // namespace astrai::kernels
