// The CUDA backend's kernels other than attention: one per elementwise or row operation, the
// small-batch product (gemv), the KV write, and the backward helpers. Plain kernels, written
// for clarity first; each row's sums have a fixed order (deterministic).
#pragma once

#include <cmath>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/dropout_mask.h"

namespace astrai::backend::cuda {
namespace {

// ---- elementwise and row kernels ----

template <typename T>
__global__ void embedding_kernel(const T* table, const int32_t* ids, int64_t n, int64_t dim, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim) return;
  const int64_t row = i / dim, c = i % dim;
  out[i] = to_float(table[static_cast<int64_t>(ids[row]) * dim + c]);
}

__global__ void gather_kernel(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim) return;
  out[i] = x[static_cast<int64_t>(rows[i / dim]) * dim + i % dim];
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t m, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < m * n) y[i] += bias[i % n];
}

template <typename T>
__global__ void round_kernel(const float* x, int64_t n, T* out);
template <>
__global__ void round_kernel<__nv_bfloat16>(const float* x, int64_t n, __nv_bfloat16* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}
template <>
__global__ void round_kernel<__half>(const float* x, int64_t n, __half* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(x[i]);
}

// One block per row: y = x · rstd · w, rstd = 1 / sqrt(mean(x²) + eps). y may alias x (every
// thread reads its elements before the barrier in block_sum and writes them after).
__global__ void rmsnorm_kernel(const float* x, int64_t dim, const float* w, float eps, float* y, float* rstd) {
  const float* xr = x + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = r;
  float* yr = y + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

// ---- small-batch products ----

// Up to this many rows gemv_kernel does the product, beyond it cuBLAS. For 16-bit weights the
// default is 2 (ASTRAI_CUDA_GEMV_ROWS sets it, 0-8): on an H200 (2026-12-04, bf16 decode steps
// as graphs) gemv won or tied at 1-2 rows on a 134M and a 1.1B model, cuBLAS's tensor cores won
// from 3 rows on the 1.1B one (docs/performance.md, "CUDA backend"). f32 weights: 8 (cuBLAS's
// SGEMM has no tensor cores to win with).
constexpr int kGemvMaxRows = 8;
constexpr int kGemvRows16Bit = 2;

// 8 consecutive weights as f32 (one 16-byte load of 16-bit weights, two of f32 ones).
__device__ void load8(const float* p, float* v) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ float2 to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ float2 to_float2(__half2 h) { return __half22float2(h); }
template <typename T>  // __nv_bfloat16 or __half
__device__ void load8(const T* p, float* v) {
  using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const Pair* h = reinterpret_cast<const Pair*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = to_float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

// y[r, j] = x[r, :] · W[j, :] (+ bias[j]) for M rows of x (decode): one warp per J outputs;
// lane l takes 8 consecutive weights of every 256, so W streams in 16-byte loads, read once
// for all M rows; x stays f32, read through L1, each load serving J weight rows (with M rows
// and J = 1 the x traffic would be 16·M times W's and L1, not memory, would set the pace).
// Needs k % 8 == 0 and 16-byte aligned rows. Each lane sums in k order, then the warp's tree:
// deterministic.
template <typename T, int M, int J>
__global__ void gemv_kernel(const float* x, int64_t k, const T* w, int64_t n, const float* bias, float* y) {
  const int64_t j0 = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp * J;
  const int lane = threadIdx.x % kWarp;
  if (j0 >= n) return;
  float acc[M][J] = {};
#pragma unroll 2
  for (int64_t c = lane * 8; c < k; c += kWarp * 8) {
    float wv[J][8];
#pragma unroll
    for (int q = 0; q < J; ++q) {
      if (j0 + q < n) load8(w + (j0 + q) * k + c, wv[q]);
      else for (int i = 0; i < 8; ++i) wv[q][i] = 0.0f;
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float xv[8];
      load8(x + r * k + c, xv);
#pragma unroll
      for (int q = 0; q < J; ++q)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][q] += wv[q][i] * xv[i];
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r)
#pragma unroll
    for (int q = 0; q < J; ++q) {
      const float sum = warp_sum(acc[r][q]);
      if (lane == 0 && j0 + q < n) y[r * n + j0 + q] = bias != nullptr ? sum + bias[j0 + q] : sum;
    }
}

template <typename T>
void launch_gemv(const float* x, int64_t m, int64_t k, const T* w, int64_t n, const float* bias, float* y,
                 cudaStream_t stream) {
  // One output per warp for 1-2 rows (more warps in flight), four from 3 rows on.
  const unsigned blocks1 = blocks_for(n * kWarp), blocks4 = blocks_for((n + 3) / 4 * kWarp);
  switch (m) {
#define ASTRAI_GEMV_CASE(R, J) \
  case R:                      \
    gemv_kernel<T, R, J><<<J == 1 ? blocks1 : blocks4, kThreads, 0, stream>>>(x, k, w, n, bias, y); \
    break;
    ASTRAI_GEMV_CASE(1, 1)
    ASTRAI_GEMV_CASE(2, 1)
    ASTRAI_GEMV_CASE(3, 4)
    ASTRAI_GEMV_CASE(4, 4)
    ASTRAI_GEMV_CASE(5, 4)
    ASTRAI_GEMV_CASE(6, 4)
    ASTRAI_GEMV_CASE(7, 4)
    ASTRAI_GEMV_CASE(8, 4)
#undef ASTRAI_GEMV_CASE
    default:
      fail("gemv: ", m, " rows (at most ", kGemvMaxRows, ")");
  }
}

// One block per row: x_out = x + delta, then rmsnorm_kernel's arithmetic on x_out (each
// thread reads back only the elements it wrote). x_out may alias x.
__global__ void add_rmsnorm_kernel(const float* x, const float* delta, int64_t dim, const float* w, float eps,
                                   float* x_out, float* y, float* rstd) {
  const int64_t base = blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = x[base + i] + delta[base + i];
    x_out[base + i] = v;
    ss += v * v;
  }
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) y[base + i] = x_out[base + i] * r * w[i];
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

__global__ void mul_kernel(const float* a, const float* b, int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] * b[i];
}

__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void sigmoid_kernel(const float* x, int64_t n, float* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = sigmoidf(x[i]);
}

__global__ void dropout_kernel(const float* x, int64_t n, float p, uint64_t seed, float* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = dropout_keep(seed, i, p) ? x[i] * (1.0f / (1.0f - p)) : 0.0f;
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const float g = gate[i];
    out[i] = g * sigmoidf(g) * up[i];
  }
}

// One thread per rotated pair of one head of one token.
__global__ void rope_kernel(float* x, int64_t tokens, int64_t heads, int64_t stride, int64_t offset, int64_t half,
                            const float* cos, const float* sin, bool adjacent, bool inverse) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * heads * half) return;
  const int64_t f = i % half, th = i / half, t = th / heads;
  float* v = x + th * stride + offset;
  const float c = cos[t * half + f], s = inverse ? -sin[t * half + f] : sin[t * half + f];
  float* lo = adjacent ? v + 2 * f : v + f;
  float* hi = adjacent ? v + 2 * f + 1 : v + f + half;
  const float a = *lo, b = *hi;
  *lo = a * c - b * s;
  *hi = a * s + b * c;
}

__global__ void split_kernel(const float* kvb, int64_t rows, int64_t kd, int64_t vd, float* k, float* v) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t row = kd + vd;
  if (i >= rows * row) return;
  const int64_t r = i / row, c = i % row;
  if (c < kd) k[r * kd + c] = kvb[i];
  else v[r * vd + c - kd] = kvb[i];
}

__global__ void join_kernel(const float* dk, const float* dv, int64_t rows, int64_t kd, int64_t vd, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t row = kd + vd;
  if (i >= rows * row) return;
  const int64_t r = i / row, c = i % row;
  out[i] = c < kd ? dk[r * kd + c] : dv[r * vd + c - kd];
}

// slot[row] = page * page_size + slot of that new token (host-computed from the page tables).
// One thread per (row, head, dim) up to the larger of the K and V widths; it writes K's and/or
// V's element there.
template <typename T>
__global__ void kv_write_kernel(const float* k, const float* v, const int32_t* slot, int64_t rows, int64_t heads,
                                int64_t k_dim, int64_t v_dim, int64_t page_size, T* k_pages, T* v_pages) {
  const int64_t width = k_dim > v_dim ? k_dim : v_dim;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * heads * width) return;
  const int64_t d = i % width, h = (i / width) % heads, r = i / (width * heads);
  const int64_t page = slot[r] / page_size, s = slot[r] % page_size;
  const int64_t at = (page * heads + h) * page_size + s;
  auto store = [](T* dst, float x) {
    if constexpr (sizeof(T) == 4) {
      *dst = x;
    } else {
      *dst = __float2bfloat16_rn(x);
    }
  };
  if (d < k_dim) store(k_pages + at * k_dim + d, k[(r * heads + h) * k_dim + d]);
  if (d < v_dim) store(v_pages + at * v_dim + d, v[(r * heads + h) * v_dim + d]);
}

// ---- backward helpers ----

// db[j] += Σ_i dy[i, j], rows in order.
__global__ void column_sum_kernel(const float* dy, int64_t m, int64_t n, float* db) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  float s = 0.0f;
  for (int64_t i = 0; i < m; ++i) s += dy[i * n + j];
  db[j] += s;
}

// dw[c] += Σ_rows dy · x · rstd (one thread per column, rows in order).
__global__ void rmsnorm_dw_kernel(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t dim,
                                  float* dw) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= dim) return;
  float s = 0.0f;
  for (int64_t r = 0; r < rows; ++r) s += dy[r * dim + c] * x[r * dim + c] * rstd[r];
  dw[c] += s;
}

// One block per row: dx (+)= rstd·(dy∘w) − x·rstd³·mean((dy∘w)∘x). dx may alias dy when not
// accumulating (each thread reads its elements before the barrier and writes after).
__global__ void rmsnorm_dx_kernel(const float* dy, const float* x, const float* w, const float* rstd, int64_t dim,
                                  float* dx, bool accumulate) {
  const int64_t base = blockIdx.x * dim;
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dot += dy[base + i] * w[i] * x[base + i];
  dot = block_sum(dot);
  const float r = rstd[blockIdx.x];
  const float coef = r * r * r * dot / static_cast<float>(dim);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = r * dy[base + i] * w[i] - x[base + i] * coef;
    dx[base + i] = accumulate ? dx[base + i] + g : g;
  }
}

__global__ void swiglu_backward_kernel(const float* dh, const float* a, const float* b, int64_t n, float* da,
                                       float* db) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float s = sigmoidf(a[i]), silu = a[i] * s, g = dh[i];
  da[i] = g * b[i] * s * (1.0f + a[i] * (1.0f - s));
  db[i] = g * silu;
}

__global__ void gate_backward_kernel(const float* dy, const float* att, const float* g, int64_t n, float* d_att,
                                     float* d_z) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i], dyi = dy[i];
  d_att[i] = dyi * gi;
  d_z[i] = dyi * att[i] * gi * (1.0f - gi);
}

// d_table[ids[t], c] += dx[t, c]: one thread per column, rows in order (no atomics).
__global__ void embedding_backward_kernel(const float* dx, const int32_t* ids, int64_t n, int64_t dim, float* d_table) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= dim) return;
  for (int64_t t = 0; t < n; ++t) d_table[static_cast<int64_t>(ids[t]) * dim + c] += dx[t * dim + c];
}

}  // namespace
}  // namespace astrai::backend::cuda
