// One threading layer for the whole process: OpenMP. OpenBLAS is linked in its OpenMP
// flavour so BLAS calls and our kernels share the same pool instead of fighting.
#pragma once

#include <cstdint>

namespace astrai {

int num_threads();
// Sets the thread count for our kernels and the BLAS (0 = all cores), for the calling thread
// only: OpenMP keeps the count per thread, and a std::thread starts with
// the process default, so a thread that runs kernels calls this itself.
void set_num_threads(int n);

// Lets the calling thread's idle OpenMP workers exit (omp_pause_resource_all). Each thread
// that opens parallel regions gets its own worker pool; once the pools together hold more
// threads than there are cores, libgomp stops spinning at barriers and every parallel region
// pays a futex wake-up. A thread hands the cores to another (the inference engine's) with
// this; its pool is recreated if it opens a parallel region again.
void release_idle_threads();

// Runs fn(i) for i in [begin, end) split statically over the threads: the partition of
// rows to threads depends only on (end - begin) and the thread count, never on timing.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, Fn&& fn) {
#pragma omp parallel for schedule(static)
  for (int64_t i = begin; i < end; ++i) fn(i);
}

}  // namespace astrai
