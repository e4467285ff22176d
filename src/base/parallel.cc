#include "base/parallel.h"

#include <omp.h>

#include <thread>

extern "C" void openblas_set_num_threads(int);

namespace astrai {

int num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

void release_idle_threads() { omp_pause_resource_all(omp_pause_soft); }

}  // namespace astrai
