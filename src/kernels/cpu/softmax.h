// Softmax family over one row, in f32 with the max subtracted first.
#pragma once

#include <cstdint>

namespace astrai::kernels {

// y[i] = exp(x[i]) by the kernels' own approximation (the one softmax, SiLU and attention use:
// about 2 ulp on [-87, 88], inputs clamped to that range). y may alias x.
void exp_values(const float* x, int64_t n, float* y);

// log(sum(exp(x))) computed stably (exact std::exp, double accumulation: used for scoring).
double logsumexp(const float* x, int64_t n);

// y[i] = x[i] - logsumexp(x). y may alias x.
void log_softmax(const float* x, int64_t n, float* y);

// y = softmax(x) in place-able form. y may alias x.
void softmax(const float* x, int64_t n, float* y);

}  // namespace astrai::kernels
