#include "kernels/cpu/rmsnorm_backward.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/level_table.h"

ASTRAI_KERNELS_BEGIN

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t rows, int64_t dim, float* dx, bool accumulate_dx, float* dw) {
  // dw is reduced over rows: each thread sums a contiguous block of rows into its own
  // buffer, then the buffers are added in thread order (deterministic for a thread count).
  // A null dw (a frozen norm weight) skips it.
  const int nt = omp_get_max_threads();
  std::vector<float> partial(dw != nullptr ? static_cast<size_t>(nt) * dim : 0, 0.0f);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int64_t begin = rows * t / nt, end = rows * (t + 1) / nt;
    float* pw = dw != nullptr ? partial.data() + static_cast<size_t>(t) * dim : nullptr;
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * dim;
      const float* dyr = dy + r * dim;
      const float s = rstd[r];
      float dot = 0.0f;
      for (int64_t i = 0; i < dim; ++i) dot += dyr[i] * w[i] * xr[i];
      const float c = dot * s * s * s / static_cast<float>(dim);
      float* dxr = dx + r * dim;
      for (int64_t i = 0; i < dim; ++i) {
        if (dw != nullptr) pw[i] += dyr[i] * xr[i] * s;
        const float g = dyr[i] * w[i] * s - xr[i] * c;
        dxr[i] = accumulate_dx ? dxr[i] + g : g;
      }
    }
  }
  if (dw == nullptr) return;
  for (int t = 0; t < nt; ++t)
    for (int64_t i = 0; i < dim; ++i) dw[i] += partial[static_cast<size_t>(t) * dim + i];
}

void fill_rmsnorm_backward(KernelTable& t) {
  t.rmsnorm_backward = &rmsnorm_backward;
}

ASTRAI_KERNELS_END
