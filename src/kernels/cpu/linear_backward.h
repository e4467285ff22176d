// Training-side linear layers over owned f32 weights (HF [out, in] layout).
//   forward:  y[M, N]  = x[M, K] · W[N, K]^T (+ b): kernels::linear, so the training forward
//             has the bits of the inference forward
//   backward: dx[M, K] (+)= dy[M, N] · W[N, K];  dW[N, K] += dy^T · x;  db[N] += Σ_rows dy
//             (SGEMM)
// Gradients of parameters always accumulate (micro-batches add into the same buffers); dx
// overwrites unless `accumulate_dx` (several projections read the same input).
#pragma once

#include <cstdint>

namespace astrai::kernels {

void linear_f32(const float* x, int64_t m, const float* w, int64_t n, int64_t k, const float* bias,
                float* y);

void linear_backward_f32(const float* dy, const float* x, int64_t m, const float* w, int64_t n,
                         int64_t k, float* dx, bool accumulate_dx, float* dw, float* db);

}  // namespace astrai::kernels
