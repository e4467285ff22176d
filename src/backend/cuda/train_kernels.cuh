// The CUDA backend's kernels for the training step outside the model: cross-entropy (the loss
// and its gradient), the gradient's squared norm per block, scaling and AdamW (included only
// by cuda_ops.cu). Each follows the CPU backend's arithmetic (ops.h); reductions run in a tree,
// so sums differ from the CPU's in the last bits.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/ops.h"

namespace astrai::backend::cuda {
namespace {

// One block per row: row_loss[r] = (1 − ε)(lse − z[y]) + ε(lse − mean z), and with dlogits
// (may alias logits) the gradient of grad_scale · loss: grad_scale · (softmax − ε/V) minus
// grad_scale · (1 − ε) at the target. Ignored rows (y < 0): loss 0 and a zero gradient.
__global__ void cross_entropy_kernel(const float* logits, const int32_t* targets, int64_t vocab, float eps,
                                     float grad_scale, float* row_loss, float* dlogits) {
  const int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  float* d = dlogits != nullptr ? dlogits + row * vocab : nullptr;
  const int32_t y = targets[row];
  if (y < 0) {
    if (threadIdx.x == 0) row_loss[row] = 0.0f;
    if (d != nullptr)
      for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) d[c] = 0.0f;
    return;
  }
  const float zy = z[y];  // read by every thread before the barriers below, so before any write
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) m = fmaxf(m, z[c]);
  m = block_max(m);
  float se = 0.0f, sz = 0.0f;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    se += expf(z[c] - m);
    sz += z[c];
  }
  se = block_sum(se);
  sz = block_sum(sz);
  const float lse = m + logf(se);
  float loss = (1.0f - eps) * (lse - zy);
  if (eps != 0.0f) loss += eps * (lse - sz / static_cast<float>(vocab));
  if (threadIdx.x == 0) row_loss[row] = loss;
  if (d == nullptr) return;
  const float uniform = eps / static_cast<float>(vocab);
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float p = expf(z[c] - lse);
    d[c] = c == y ? grad_scale * (p - uniform - (1.0f - eps)) : grad_scale * p - grad_scale * uniform;
  }
}

// One block per range: out[b] = Σ x[i]² over ranges[b], in double.
__global__ void sum_squares_kernel(const FloatRange* ranges, const float* x, double* out) {
  const FloatRange r = ranges[blockIdx.x];
  double s = 0.0;
  for (size_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void scale_kernel(float* x, size_t n, float c) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= c;
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, size_t n, AdamWStep s) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i];
  const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
  const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
  p[i] = p[i] * s.decay - s.step_size * (mi / denom);
}

}  // namespace
}  // namespace astrai::backend::cuda
