#include "kernels/cpu/linear_backward.h"

#include <cblas.h>

#include "kernels/cpu/level_table.h"

ASTRAI_KERNELS_BEGIN

void linear_backward_f32(const float* dy, const float* x, int64_t m, const float* w, int64_t n,
                         int64_t k, float* dx, bool accumulate_dx, float* dw, float* db) {
  if (m == 0) return;
  if (dx != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(k),
                static_cast<int>(n), 1.0f, dy, static_cast<int>(n), w, static_cast<int>(k),
                accumulate_dx ? 1.0f : 0.0f, dx, static_cast<int>(k));
  }
  if (dw != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(k),
                static_cast<int>(m), 1.0f, dy, static_cast<int>(n), x, static_cast<int>(k), 1.0f, dw,
                static_cast<int>(k));
  }
  if (db != nullptr) {
    // Column sums in a fixed row order per column: deterministic whatever the thread count.
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t i = 0; i < m; ++i) s += dy[i * n + j];
      db[j] += s;
    }
  }
}

void fill_linear_backward(KernelTable& t) {
  t.linear_backward_f32 = &linear_backward_f32;
}

ASTRAI_KERNELS_END
