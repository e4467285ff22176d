// The backward of a linear layer over owned f32 weights (HF [out, in] layout), by SGEMM. The
// forward is kernels::linear (matmul.h), the inference forward's own, y = x · W^T (+ b):
//   dx[M, K] (+)= dy[M, N] · W[N, K];  dW[N, K] += dy^T · x;  db[N] += Σ_rows dy
// Gradients of parameters always accumulate (micro-batches add into the same buffers); dx
// overwrites unless `accumulate_dx` (several projections read the same input).
#pragma once

#include <cstdint>

namespace astrai::kernels {

void linear_backward_f32(const float* dy, const float* x, int64_t m, const float* w, int64_t n,
                         int64_t k, float* dx, bool accumulate_dx, float* dw, float* db);

}  // namespace astrai::kernels
