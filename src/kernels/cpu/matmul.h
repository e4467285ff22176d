// Linear layers: y[M, N] = x[M, K] · W[N, K]^T (+ bias), W in the Hugging Face [out, in]
// layout, stored as f32, bf16 or f16 (usually memory-mapped). x and y are f32.
//
// Batch invariance: the value of y[i, :] depends only on x[i, :] and W, never on M or on the
// other rows: every output is reduced over K in one fixed order whatever the batch shape.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace astrai::kernels {

struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;  // N (output features)
  int64_t cols = 0;  // K (input features)
};

inline WeightView weight_view(const Tensor& w) {
  return WeightView{w.raw(), w.dtype(), w.dim(0), w.ndim() > 1 ? w.dim(1) : 1};
}

// y = x · W^T (+ bias). bias may be null (f32, length N). Multithreaded over the
// caller's OpenMP team; call it from outside any parallel region.
void linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y);

// One product of a group: y = x · W^T (+ bias).
struct LinearOut {
  WeightView w;
  const float* bias = nullptr;
  float* y = nullptr;
};

// Several products of the same x (q, k and v; gate and up), each y equal, bit for bit, to
// linear()'s. Quantized weights times 8-bit activations (whose block sizes agree) run as
// one job: x quantized once, the outputs of every matrix split over the threads together, the
// next matrix's first rows prefetched while a thread ends the last; the rest one by one.
void linear_group(const float* x, int64_t m, const LinearOut* outs, int64_t n);

}  // namespace astrai::kernels
