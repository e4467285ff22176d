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
// rmsnorm (the same bits) that also writes each row's rstd = 1 / sqrt(mean(x²) + eps), which the
// backward (rmsnorm_backward.h) needs. y must not alias x.
void rmsnorm_forward_train(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                           float* rstd);

}  // namespace astrai::kernels
