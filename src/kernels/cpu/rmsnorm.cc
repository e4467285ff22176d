#include "kernels/cpu/rmsnorm.h"

#include <cmath>

#include "kernels/cpu/level_table.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

namespace {

// Returns the row's rstd (the training forward saves it for the backward).
inline float norm_row(const float* xr, int64_t dim, const float* w, float eps, float* yr) {
  const float mean = sum_squares(xr, dim) / static_cast<float>(dim);
  const float rstd = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * rstd);
  return rstd;
}

// Small problems stay on one thread: forking costs more than the work. From 8192 elements
// (a 32-row decode step at hidden 768) each thread normalises the rows it just wrote in the
// residual add, instead of one thread pulling half of them from the other core's cache.
constexpr int64_t kParallelMin = 1 << 13;

}  // namespace

void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y) {
#pragma omp parallel for schedule(static) if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) norm_row(x + r * dim, dim, w, eps, y + r * dim);
}

void add_rmsnorm(float* x, const float* delta, int64_t rows, int64_t dim, const float* w, float eps, float* y) {
#pragma omp parallel for schedule(static) if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * dim;
    const float* dr = delta + r * dim;
    for (int64_t i = 0; i < dim; ++i) xr[i] += dr[i];
    norm_row(xr, dim, w, eps, y + r * dim);
  }
}

void rmsnorm_forward_train(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                           float* rstd) {
#pragma omp parallel for schedule(static) if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) rstd[r] = norm_row(x + r * dim, dim, w, eps, y + r * dim);
}

void fill_rmsnorm(KernelTable& t) {
  t.rmsnorm = &rmsnorm;
  t.add_rmsnorm = &add_rmsnorm;
  t.rmsnorm_forward_train = &rmsnorm_forward_train;
}

ASTRAI_KERNELS_END
