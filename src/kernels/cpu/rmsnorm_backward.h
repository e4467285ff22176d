// RMSNorm for training: y = x · rstd · w with rstd = 1 / sqrt(mean(x²) + eps) per row
// (Hugging Face Llama semantics, computed in f32). The forward saves rstd for the backward.
#pragma once

#include <cstdint>

namespace astrai::kernels {

void rmsnorm_forward_train(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                           float* y, float* rstd);

// dx = rstd·(dy∘w) − x·rstd³·mean((dy∘w)∘x), written (or added when accumulate_dx) to dx;
// dw += Σ_rows dy∘x·rstd. dx may alias dy only when !accumulate_dx.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t rows, int64_t dim, float* dx, bool accumulate_dx, float* dw);

}  // namespace astrai::kernels
