// RMSNorm (Hugging Face Llama semantics, f32): y = w * (x / sqrt(mean(x^2) + eps)) per row.
#pragma once

#include <cstdint>

namespace astrai::kernels {

// rows x dim, row-major; y may alias x. Each row's result depends on that row only.
void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y);

// The residual add and the norm after it in one pass: x += delta, then y = rmsnorm(x) (y must
// not alias x or delta). The same operations as add_inplace followed by rmsnorm, so the same
// bits; one parallel region and one read of x instead of two.
void add_rmsnorm(float* x, const float* delta, int64_t rows, int64_t dim, const float* w, float eps, float* y);

}  // namespace astrai::kernels
