#include "kernels/cpu/softmax.h"

#include <cmath>

#include "kernels/cpu/level_table.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

void exp_values(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += kLanes) vstore_n(y + i, exp_approx(vload_n(x + i, n - i)), n - i);
}

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
  const Vec16 m(max_value(x, n));
  for (int64_t i = 0; i < n; i += kLanes) vstore_n(y + i, exp_approx(vload_n(x + i, n - i) - m), n - i);
  const float inv = 1.0f / sum(y, n);
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

void fill_softmax(KernelTable& t) {
  t.exp_values = &exp_values;
  t.logsumexp = &logsumexp;
  t.log_softmax = &log_softmax;
  t.softmax = &softmax;
}

ASTRAI_KERNELS_END
