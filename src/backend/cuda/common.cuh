// What every part of the CUDA backend shares (included only by cuda_ops.cu, one translation
// unit): error checks, launch geometry, warp and block sums and maxima, 16-bit loads as f32.
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

struct Add {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The warp's values combined by op (xor butterfly: every lane gets the result).
template <typename T, typename Op>
__device__ T warp_reduce(T v, Op op) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The block's values combined by op (blockDim.x == kThreads): each warp's result, then the
// warps' in order; the same tree every call, so the same bits.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T part[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_reduce(v, op);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  T total = part[0];
  for (int i = 1; i < kThreads / kWarp; ++i) total = op(total, part[i]);
  __syncthreads();
  return total;
}

__device__ float warp_sum(float v) { return warp_reduce(v, Add{}); }
__device__ float block_sum(float v) { return block_reduce(v, Add{}); }
__device__ double block_sum(double v) { return block_reduce(v, Add{}); }
__device__ float block_max(float v) { return block_reduce(v, Max{}); }

__device__ float to_float(float x) { return x; }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float to_float(__half x) { return __half2float(x); }

}  // namespace
}  // namespace astrai::backend::cuda
