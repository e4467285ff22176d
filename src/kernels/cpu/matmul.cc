// kernels::linear — batch-invariant y = x · W^T (+ bias) on AVX-512.
//
// Reduction order (the batch-invariance contract): every output y[i, j] is computed as
//   16 lane partial sums, lane l accumulating x[i, k] * w[j, k] for k = l, l + 16, l + 32, ...
//   in increasing k with one fused multiply-add each (the K tail is zero-padded),
//   then hsum16 (one fixed tree), then + bias[j].
// Every path (any M, any tile shape, any thread count) performs exactly these operations per
// output, so y[i, :] is bit-identical whatever M is and whatever the other rows are.
#include "kernels/cpu/matmul.h"

// GCC 12's own _mm512_cvtph_ps trips -Wmaybe-uninitialized inside its header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "base/error.h"

namespace astrai::kernels {

namespace {

inline float hsum16(__m512 v) {
  // Fixed tree: (lo256 + hi256), then 128-bit halves, then pairs.
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

template <DType T>
inline __m512 load_w(const void* base, int64_t k, __mmask16 mask) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + k);
  } else if constexpr (T == DType::kBF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + k);
    return _mm512_cvtph_ps(h);
  }
}

template <DType T>
void linear_simple(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  const int64_t n = w.rows, kk = w.cols;
  const size_t esz = dtype_size(T);
  const int64_t kfull = kk / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (kk - kfull)) - 1);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    const void* wr = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(j) * kk * esz;
    for (int64_t i = 0; i < m; ++i) {
      const float* xr = x + i * kk;
      __m512 acc = _mm512_setzero_ps();
      int64_t k = 0;
      for (; k < kfull; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(xr + k), load_w<T>(wr, k, 0xffff), acc);
      if (tail) acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, xr + k), load_w<T>(wr, k, tail), acc);
      float v = hsum16(acc);
      if (bias) v += bias[j];
      y[i * n + j] = v;
    }
  }
}

}  // namespace

void linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  ASTRAI_CHECK(m >= 0 && w.rows >= 0 && w.cols >= 0, "linear: negative shape");
  if (m == 0 || w.rows == 0) return;
  switch (w.dtype) {
    case DType::kF32: return linear_simple<DType::kF32>(x, m, w, bias, y);
    case DType::kBF16: return linear_simple<DType::kBF16>(x, m, w, bias, y);
    case DType::kF16: return linear_simple<DType::kF16>(x, m, w, bias, y);
    default: fail("linear: unsupported weight dtype ", dtype_name(w.dtype));
  }
}

}  // namespace astrai::kernels
