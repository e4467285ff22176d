// The backward of RMSNorm (kernels/cpu/rmsnorm.h): y = x · rstd · w with
// rstd = 1 / sqrt(mean(x²) + eps) per row, saved by rmsnorm_forward_train.
#pragma once

#include <cstdint>

namespace astrai::kernels {


// dx = rstd·(dy∘w) − x·rstd³·mean((dy∘w)∘x), written (or added when accumulate_dx) to dx;
// dw += Σ_rows dy∘x·rstd. dx may alias dy only when !accumulate_dx.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t rows, int64_t dim, float* dx, bool accumulate_dx, float* dw);

}  // namespace astrai::kernels
