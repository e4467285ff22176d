#include "kernels/cpu/softmax.h"

#include <cmath>

#include "kernels/cpu/vec_math.h"

namespace astrai::kernels {

double logsumexp(const float* x, int64_t n) {
  if (n <= 0) return -INFINITY;
  const float m = max_value(x, n);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  return m + std::log(s);
}

void log_softmax(const float* x, int64_t n, float* y) {
  const double lse = logsumexp(x, n);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] - lse);
}

void softmax(const float* x, int64_t n, float* y) {
  const float m = max_value(x, n);
  exp_shifted(x, m, n, y);
  const float inv = 1.0f / sum(y, n);
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

}  // namespace astrai::kernels
