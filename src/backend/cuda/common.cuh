// What every part of the CUDA backend shares (included only by cuda_ops.cu, one translation
// unit): error checks, launch geometry, warp and block sums, 16-bit loads as f32.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/error.h"

namespace astrai::backend::cuda {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: ", what, ": ", cudaGetErrorString(e));
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: ", what, ": status ", static_cast<int>(s));
}

void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kMaxPerLane = 8;  // head dims up to 256 in warp registers

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x == kThreads), the same tree every call.
__device__ float block_sum(float v) {
  __shared__ float part[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / kWarp; ++i) total += part[i];
  __syncthreads();
  return total;
}

__device__ float to_float(float x) { return x; }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float to_float(__half x) { return __half2float(x); }

}  // namespace
}  // namespace astrai::backend::cuda
