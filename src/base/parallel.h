// One threading layer for the whole process: OpenMP. OpenBLAS is linked in its OpenMP
// flavour so BLAS calls and our kernels share the same pool instead of fighting.
#pragma once

#include <cstdint>

namespace astrai {

int num_threads();
// Sets the thread count for our kernels and the BLAS (0 = all cores).
void set_num_threads(int n);

// Runs fn(i) for i in [begin, end) split statically over the threads: the partition of
// rows to threads depends only on (end - begin) and the thread count, never on timing.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, Fn&& fn) {
#pragma omp parallel for schedule(static)
  for (int64_t i = begin; i < end; ++i) fn(i);
}

}  // namespace astrai
