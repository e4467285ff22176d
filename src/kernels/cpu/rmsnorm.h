// RMSNorm (Hugging Face Llama semantics, f32): y = w * (x / sqrt(mean(x^2) + eps)) per row.
#pragma once

#include <cstdint>

namespace astrai::kernels {

// rows x dim, row-major; y may alias x. Each row's result depends on that row only.
void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y);

}  // namespace astrai::kernels
