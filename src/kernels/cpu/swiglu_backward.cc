#include "kernels/cpu/swiglu_backward.h"

#include <cmath>

namespace astrai::kernels {

void swiglu_forward_train(const float* a, const float* b, int64_t n, float* h) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float sg = 1.0f / (1.0f + std::exp(-a[i]));
    h[i] = a[i] * sg * b[i];
  }
}

void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da, float* db) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float sg = 1.0f / (1.0f + std::exp(-a[i]));
    const float silu = a[i] * sg;
    const float g = dh[i];
    da[i] = g * b[i] * sg * (1.0f + a[i] * (1.0f - sg));
    db[i] = g * silu;
  }
}

void sigmoid_forward(const float* x, int64_t n, float* g) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

}  // namespace astrai::kernels
