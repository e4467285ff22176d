// Ops::sample on the GPU: one block of kThreads per spec runs backend/sample_rows.h (the
// algorithm the CPU backend runs with one thread, giving the same bits), its phases separated by
// __syncthreads; the row's scratch is in device memory, the phases' shared values in shared
// memory.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/sample_rows.h"

namespace astrai::backend::cuda {
namespace {

// sample_rows.h's block on the device: every thread runs a phase with its index, then all wait
// (and wait before it, so a phase never overwrites a shared value a slower thread still reads).
struct DeviceBlock {
  int threads = kThreads;
  template <class F>
  __host__ __device__ void each(F&& f) const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
    f(static_cast<int>(threadIdx.x));
    __syncthreads();
#endif
  }
};

// Rows each launch samples at most: bounds the scratch (keys: 8 bytes per power-of-two slot of
// the vocabulary per row, 2 MiB per row at 152k).
constexpr int64_t kSampleRowsPerLaunch = 32;

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t vocab, const SampleSpec* specs, float* w, uint64_t* keys,
                  int64_t keys_per_row, double* blocks, int64_t blocks_per_row, SampleResult* out) {
  __shared__ sampling::Shared shared;
  const int64_t r = blockIdx.x;
  const SampleSpec spec = specs[r];
  if (threadIdx.x == 0) out[r] = SampleResult{};
  const sampling::RowScratch scratch{w + r * vocab, keys + r * keys_per_row, blocks + r * blocks_per_row};
  sampling::sample_row(DeviceBlock{}, shared, logits + spec.row * vocab, vocab, spec, scratch, out[r]);
}

}  // namespace
}  // namespace astrai::backend::cuda
