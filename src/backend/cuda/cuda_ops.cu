// The CUDA backend: backend::Ops over device memory. Matrix products are cuBLAS (f32 SGEMM, or
// GemmEx with the activations rounded to the weights' 16-bit type and f32 accumulation);
// everything else is a plain kernel below, one per operation, written for clarity first:
// attention is a block of warps per (query row, head), split over the keys when the batch is
// too small to fill the GPU (flash-decoding), and its backward recomputes the probabilities
// from the saved log-sum-exp (dq per query, dk/dv per key, so nothing needs atomics and every
// sum has a fixed order).
//
// All work goes to one stream of the backend's. Index arrays arrive in host memory (ops.h);
// each operation copies what it needs through a pinned staging buffer into device arrays that
// grow and are reused (Stager, DeviceArray). Decode steps can be recorded as CUDA graphs and
// replayed (run_cached): a replay redoes only the host side of each operation, whose uploads
// land where the graph copies them from (Mode::kPrepare).
#include "backend/cuda/cuda_ops.h"
#include "backend/dropout_mask.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "kernels/cpu/rope.h"

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
__device__ void load8(const __nv_bfloat16* p, float* v) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
__device__ void load8(const __half* p, float* v) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
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

// ---- attention ----

// One query row of a sequence: its row in q/out, how many keys it sees, and where they are:
// contiguous: key p is row base + p; paged: key p is in page table[base + p / page_size].
struct QueryDesc {
  int32_t row, kv_len, base;
};

template <typename T>
__device__ const T* key_row(const T* k, const int32_t* tables, const QueryDesc& q, int32_t p, int64_t kv_heads,
                            int64_t kvh, int64_t dim, int32_t page_size) {
  if (page_size == 0) return k + ((static_cast<int64_t>(q.base) + p) * kv_heads + kvh) * dim;
  const int64_t page = tables[q.base + p / page_size], slot = p % page_size;
  return k + ((page * kv_heads + kvh) * page_size + slot) * dim;
}

constexpr int kAttnWarps = 4;     // warps of one attention block, each over its own keys
constexpr int kMaxSplits = 64;    // key ranges one (query, head) is split into at most
constexpr int kMinSplitKeys = 32;  // keys a split has at least (fewer splits for short contexts)

// The splits a query with kv_len keys uses of the launch's `splits` (computed on the device
// from its own length, so a recorded step stays valid while contexts grow).
__device__ int splits_for(int32_t kv_len, int splits) {
  return max(1, min(splits, (kv_len + kMinSplitKeys - 1) / kMinSplitKeys));
}

// Online-softmax state of some keys of one (query, head): running max m, sum l of
// exp(s - m), and the exp-weighted sum of value rows (lane l holds dims l, l + 32, ...).
struct SoftmaxPart {
  float m = -INFINITY, l = 0.0f;
  float acc[kMaxPerLane] = {};
};

// Grid (query rows × heads, launch splits), kAttnWarps warps per block. A (query, head) sees
// keys [0, kv_len) in splits_for(kv_len) of the launch's splits (at least kMinSplitKeys keys
// each; the other blocks return at once); split s takes the range [s·c, (s+1)·c) with
// c = ceil(kv_len / splits), and its warps take every kAttnWarps-th key of it. The warps' states merge in shared memory in
// warp order; with one split the block writes the output and lse, else its partial state
// (out unnormalised, then m and l) for attention_combine_kernel. Flash-decoding: a decode
// step's few queries still spread over the whole GPU for long contexts.
template <typename T>
__global__ void attention_kernel(const float* q, const T* k, const T* v, const int32_t* tables,
                                 const QueryDesc* queries, int64_t heads, int64_t kv_heads, int64_t qk_dim,
                                 int64_t v_dim, float scale, int32_t page_size, float* out, float* lse,
                                 float* partial) {
  const int64_t qh = blockIdx.x, h = qh % heads, kvh = h / (heads / kv_heads);
  const int split = blockIdx.y, stride = gridDim.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const QueryDesc qd = queries[qh / heads];
  const int splits = splits_for(qd.kv_len, stride);
  if (split >= splits) return;  // this query's keys need fewer splits than the launch has
  const int32_t chunk = (qd.kv_len + splits - 1) / splits;
  const int32_t begin = split * chunk, end = min(qd.kv_len, begin + chunk);
  const float* qr = q + (static_cast<int64_t>(qd.row) * heads + h) * qk_dim;
  float qv[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    qv[j] = d < qk_dim ? qr[d] : 0.0f;
  }
  SoftmaxPart st;
  for (int32_t p = begin + warp; p < end; p += kAttnWarps) {
    const T* kr = key_row(k, tables, qd, p, kv_heads, kvh, qk_dim, page_size);
    const T* vr = key_row(v, tables, qd, p, kv_heads, kvh, v_dim, page_size);
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t d = lane + j * kWarp;
      if (d < qk_dim) dot += qv[j] * to_float(kr[d]);
    }
    const float s = warp_sum(dot) * scale;
    const float m_new = fmaxf(st.m, s);
    const float keep = expf(st.m - m_new), e = expf(s - m_new);
    st.l = st.l * keep + e;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t d = lane + j * kWarp;
      if (d < v_dim) st.acc[j] = st.acc[j] * keep + e * to_float(vr[d]);
    }
    st.m = m_new;
  }
  __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps], sm_acc[kAttnWarps][kWarp * kMaxPerLane];
  if (lane == 0) sm_m[warp] = st.m, sm_l[warp] = st.l;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) sm_acc[warp][lane + j * kWarp] = st.acc[j];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm_m[w]);
  float L = 0.0f, o[kMaxPerLane] = {};
  for (int w = 0; w < kAttnWarps; ++w) {
    if (sm_l[w] == 0.0f) continue;  // a warp that saw no key
    const float f = expf(sm_m[w] - M);
    L += sm_l[w] * f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) o[j] += sm_acc[w][lane + j * kWarp] * f;
  }
  const int64_t row_head = static_cast<int64_t>(qd.row) * heads + h;
  if (splits == 1) {  // the whole result: no combine for this query
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t d = lane + j * kWarp;
      if (d < v_dim) out[row_head * v_dim + d] = o[j] / L;
    }
    if (lse != nullptr && lane == 0) lse[row_head] = M + logf(L);
    return;
  }
  float* part = partial + (qh * stride + split) * (v_dim + 2);
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    if (d < v_dim) part[d] = o[j];
  }
  if (lane == 0) part[v_dim] = M, part[v_dim + 1] = L;
}

// One warp per (query, head) of more than one split: the splits' partial states merged (the
// part buffer has the launch's splits per (query, head)). Lane j holds splits j and
// j + 32 (their max and weight exp(m_s - M)); the weights go through shared memory and every
// output dim sums its splits in split order, loads independent of each other.
__global__ void attention_combine_kernel(const QueryDesc* queries, int64_t num_qh, int64_t heads, int64_t v_dim,
                                         int stride, const float* partial, float* out, float* lse) {
  static_assert(kMaxSplits <= 2 * kWarp, "two splits per lane");
  __shared__ float weight[kThreads / kWarp][kMaxSplits];
  const int64_t qh = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (qh >= num_qh) return;
  const int splits = splits_for(queries[qh / heads].kv_len, stride);
  if (splits == 1) return;  // attention_kernel wrote this query's result
  const float* part = partial + qh * stride * (v_dim + 2);
  float m[2], l[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int s = lane + i * kWarp;
    l[i] = s < splits ? part[s * (v_dim + 2) + v_dim + 1] : 0.0f;
    m[i] = l[i] > 0.0f ? part[s * (v_dim + 2) + v_dim] : -INFINITY;  // l = 0: no key in that split
  }
  float M = fmaxf(m[0], m[1]);
  for (int o = kWarp / 2; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float lw = 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float f = l[i] > 0.0f ? expf(m[i] - M) : 0.0f;
    if (lane + i * kWarp < kMaxSplits) weight[warp][lane + i * kWarp] = f;
    lw += l[i] * f;
  }
  const float L = warp_sum(lw);
  __syncwarp();
  float o[kMaxPerLane] = {};
#pragma unroll 4
  for (int s = 0; s < splits; ++s) {
    const float f = weight[warp][s];
    const float* ps = part + s * (v_dim + 2);
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t d = lane + j * kWarp;
      if (d < v_dim) o[j] += ps[d] * f;
    }
  }
  const int64_t row_head = static_cast<int64_t>(queries[qh / heads].row) * heads + qh % heads;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    if (d < v_dim) out[row_head * v_dim + d] = o[j] / L;
  }
  if (lse != nullptr && lane == 0) lse[row_head] = M + logf(L);
}

// Per token row of the batch: the first row of its document and its index in it (-1: the row
// belongs to no document).
struct DocPos {
  int32_t begin, index, len;
};

// D[row, h] = dout · out (the softmax backward's row term).
__global__ void attn_rowdot_kernel(const float* dout, const float* out, int64_t rows_heads, int64_t v_dim, float* D) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= rows_heads) return;
  float s = 0.0f;
  for (int64_t d = lane; d < v_dim; d += kWarp) s += dout[warp * v_dim + d] * out[warp * v_dim + d];
  s = warp_sum(s);
  if (lane == 0) D[warp] = s;
}

// dq: one warp per (query row, head), over the keys its row saw.
__global__ void attn_dq_kernel(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                               const float* D, const DocPos* pos, int64_t rows, int64_t heads, int64_t kv_heads,
                               int64_t qk_dim, int64_t v_dim, float scale, float* dq) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= rows * heads) return;
  const int64_t row = warp / heads, h = warp % heads, kvh = h / (heads / kv_heads);
  const DocPos dp = pos[row];
  float qv[kMaxPerLane], go[kMaxPerLane], acc[kMaxPerLane];
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    qv[j] = d < qk_dim ? q[warp * qk_dim + d] : 0.0f;
    go[j] = d < v_dim ? dout[warp * v_dim + d] : 0.0f;
    acc[j] = 0.0f;
  }
  if (dp.index >= 0) {
    const float L = lse[warp], Dr = D[warp];
    for (int32_t p = 0; p <= dp.index; ++p) {
      const int64_t kr = (static_cast<int64_t>(dp.begin) + p) * kv_heads + kvh;
      float dot = 0.0f, dpv = 0.0f;
      for (int j = 0; j < kMaxPerLane; ++j) {
        const int64_t d = lane + j * kWarp;
        if (d < qk_dim) dot += qv[j] * k[kr * qk_dim + d];
        if (d < v_dim) dpv += go[j] * v[kr * v_dim + d];
      }
      const float P = expf(warp_sum(dot) * scale - L);
      const float dS = P * (warp_sum(dpv) - Dr);
      for (int j = 0; j < kMaxPerLane; ++j) {
        const int64_t d = lane + j * kWarp;
        if (d < qk_dim) acc[j] += scale * dS * k[kr * qk_dim + d];
      }
    }
  }
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    if (d < qk_dim) dq[warp * qk_dim + d] = acc[j];
  }
}

// dk, dv: one warp per (key row, kv head), over the query rows of its document at or after it
// and the query heads that read this kv head.
__global__ void attn_dkv_kernel(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                                const float* D, const DocPos* pos, int64_t rows, int64_t heads, int64_t kv_heads,
                                int64_t qk_dim, int64_t v_dim, float scale, float* dk, float* dv) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= rows * kv_heads) return;
  const int64_t row = warp / kv_heads, kvh = warp % kv_heads, group = heads / kv_heads;
  const DocPos dp = pos[row];
  float kv[kMaxPerLane], vv[kMaxPerLane], gk[kMaxPerLane], gv[kMaxPerLane];
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    kv[j] = d < qk_dim ? k[warp * qk_dim + d] : 0.0f;
    vv[j] = d < v_dim ? v[warp * v_dim + d] : 0.0f;
    gk[j] = gv[j] = 0.0f;
  }
  if (dp.index >= 0) {
    for (int32_t i = dp.index; i < dp.len; ++i) {
      const int64_t qrow = static_cast<int64_t>(dp.begin) + i;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t qh = qrow * heads + kvh * group + g;
        float dot = 0.0f, dpv = 0.0f;
        for (int j = 0; j < kMaxPerLane; ++j) {
          const int64_t d = lane + j * kWarp;
          if (d < qk_dim) dot += q[qh * qk_dim + d] * kv[j];
          if (d < v_dim) dpv += dout[qh * v_dim + d] * vv[j];
        }
        const float P = expf(warp_sum(dot) * scale - lse[qh]);
        const float dS = P * (warp_sum(dpv) - D[qh]);
        for (int j = 0; j < kMaxPerLane; ++j) {
          const int64_t d = lane + j * kWarp;
          if (d < qk_dim) gk[j] += scale * dS * q[qh * qk_dim + d];
          if (d < v_dim) gv[j] += P * dout[qh * v_dim + d];
        }
      }
    }
  }
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    if (d < qk_dim) dk[warp * qk_dim + d] = gk[j];
    if (d < v_dim) dv[warp * v_dim + d] = gv[j];
  }
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

// How the operations run: kRun issues the work; kCapture records it into a CUDA graph (nothing
// runs); kPrepare does only the host side of each operation (its index arrays go to the same
// staging places the captured graph copies from) and issues nothing: the graph then replays.
enum class Mode { kRun, kCapture, kPrepare };

// Index arrays go to the device through one pinned host buffer: written at a cursor, copied
// by cudaMemcpyAsync on the backend's stream. The cursor restarts only after the stream has
// drained (a wrap, or the start of a cached step), so a pending copy never reads overwritten
// bytes. Within a cached step the uploads are logged (kCapture) and checked (kPrepare): a
// replay is valid only when every upload has the destination, place and size it had when the
// graph was captured.
class Stager {
 public:
  struct Upload {
    const void* dst;
    size_t offset, bytes;
  };
  Stager() = default;
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;
  ~Stager() { cudaFreeHost(host_); }

  // Starts a cached step: the stream has drained, so the buffer restarts at 0.
  void begin_step() {
    ++step_;
    cursor_ = 0;
    step_bytes_ = 0;
    checked_ = 0;
    matches_ = true;
  }
  void put(void* dst, const void* src, size_t bytes, Mode mode, cudaStream_t stream) {
    if (bytes == 0) return;
    const size_t span = (bytes + 63) / 64 * 64;
    step_bytes_ += span;
    if (mode == Mode::kRun) {
      if (cursor_ + span > capacity_) {
        check_cuda(cudaStreamSynchronize(stream), "staging: waiting for earlier copies");
        cursor_ = 0;
        if (span > capacity_) grow(span);
      }
    } else if (cursor_ + span > capacity_) {
      // A capture or replay cannot wait or reallocate; the step runs uncached (the run before
      // a capture sizes the buffer, so this is rare).
      matches_ = false;
      return;
    }
    if (mode == Mode::kPrepare) {
      matches_ = matches_ && checked_ < log_.size() && log_[checked_].dst == dst &&
                 log_[checked_].offset == cursor_ && log_[checked_].bytes == bytes;
      ++checked_;
    }
    std::memcpy(host_ + cursor_, src, bytes);
    if (mode != Mode::kPrepare)
      check_cuda(cudaMemcpyAsync(dst, host_ + cursor_, bytes, cudaMemcpyHostToDevice, stream), "upload");
    if (mode == Mode::kCapture) log_.push_back(Upload{dst, cursor_, bytes});
    cursor_ += span;
  }
  // Scratch a cached step's kernels use: logged when captured and checked when prepared like an
  // upload of no bytes, so a graph whose scratch has moved since is not replayed.
  void note(const void* scratch, Mode mode) {
    if (mode == Mode::kCapture) log_.push_back(Upload{scratch, kScratch, 0});
    if (mode == Mode::kPrepare) {
      matches_ = matches_ && checked_ < log_.size() && log_[checked_].dst == scratch && log_[checked_].offset == kScratch;
      ++checked_;
    }
  }
  // After a kRun step: room for a step of that size without a wrap (the stream has drained).
  void fit_step() {
    if (step_bytes_ > capacity_) grow(step_bytes_);
  }
  void start_log() { log_.clear(); }
  void invalidate() { matches_ = false; }
  // Whether the prepared step made exactly the captured uploads.
  bool prepared_matches() const { return matches_ && checked_ == log_.size(); }
  bool capture_fits() const { return matches_; }
  // Counts cached steps (an upload within one may reuse that step's earlier copy).
  uint64_t step() const { return step_; }
  // Changes whenever the buffer moves (graphs copying from the old one are stale).
  uint64_t generation() const { return generation_; }

 private:
  void grow(size_t bytes) {
    check_cuda(cudaFreeHost(host_), "staging: free");
    host_ = nullptr;
    capacity_ = std::max<size_t>({bytes, 2 * capacity_, size_t(1) << 20});
    check_cuda(cudaMallocHost(&host_, capacity_), "staging: pinned host memory");
    cursor_ = 0;
    ++generation_;
  }
  static constexpr size_t kScratch = ~size_t(0);  // the offset of a scratch entry
  char* host_ = nullptr;
  size_t capacity_ = 0, cursor_ = 0, step_bytes_ = 0;
  std::vector<Upload> log_;
  size_t checked_ = 0;
  bool matches_ = true;
  uint64_t generation_ = 0;
  uint64_t step_ = 0;
};

// A device array that grows on demand and is reused.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }
  // Room for n elements (kRun only: the others must not allocate; their sizes were settled
  // by the run before the capture, and a prepared step that needs more no longer matches).
  T* reserve(size_t n) {
    if (n > capacity_) {
      check_cuda(cudaFree(data_), "free");
      data_ = nullptr;
      last_.clear();
      check_cuda(cudaMalloc(&data_, n * sizeof(T)), "allocating scratch");
      capacity_ = n;
    }
    return data_;
  }
  T* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  // The host values on the device. Every layer of a forward sends the same step's indices:
  // when they equal the last upload, the device copy is reused (one copy per step, not per
  // layer). In a cached step only a copy made earlier in that step counts (the graph holds
  // its first copy), and the reuse is noted, so a prepared step that would copy where the
  // capture reused (or the reverse) does not replay.
  const T* upload(const std::vector<T>& host, Stager& stager, Mode mode, cudaStream_t stream) {
    const size_t bytes = host.size() * sizeof(T);
    const bool same = data_ != nullptr && bytes == last_.size() && std::memcmp(host.data(), last_.data(), bytes) == 0;
    if (same && mode == Mode::kRun) return data_;
    if (same && last_step_ == stager.step()) {
      stager.note(data_, mode);
      return data_;
    }
    if (host.size() > capacity_ && mode != Mode::kRun) {
      stager.invalidate();  // the graph no longer fits this step: it runs uncached
      if (mode == Mode::kCapture) return data_;  // no allocation while capturing; discarded
    }
    T* d = reserve(std::max<size_t>(host.size(), 1));
    stager.put(d, host.data(), bytes, mode, stream);
    last_.assign(reinterpret_cast<const char*>(host.data()), reinterpret_cast<const char*>(host.data()) + bytes);
    last_step_ = stager.step();
    return d;
  }
  // The device copy is unknown (a cached step's copies did not run): the next upload copies.
  void forget() { last_.clear(); }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
  std::vector<char> last_;  // the bytes last uploaded
  uint64_t last_step_ = ~uint64_t(0);  // the stager's step they were uploaded in
};

// A captured decode step: its graph, the staging generation it copies from, and when it was
// last used (the cache keeps the kMaxGraphs most recent).
struct CachedStep {
  cudaGraphExec_t exec = nullptr;  // null: seen once, not captured yet
  uint64_t generation = 0;
  uint64_t last_use = 0;
  int misses = 0;  // prepared steps in a row that did not match their capture
};
// A key whose prepared steps keep differing from their captures (something in the step that
// the key does not name changes every step) runs op by op from then on: capturing it again
// each time would cost more than it saves.
constexpr int kMaxMisses = 4;
constexpr size_t kMaxGraphs = 32;
constexpr size_t kBlasWorkspace = size_t(32) << 20;  // cuBLAS's workspace, set so graphs can hold its calls

class CudaOps final : public Ops {
 public:
  CudaOps() {
    check_cuda(cudaStreamCreate(&stream_), "creating the stream");  // blocking: ordered with the legacy stream
    check_blas(cublasCreate(&blas_), "create handle");
    check_blas(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "math mode (no TF32)");
    check_blas(cublasSetStream(blas_, stream_), "stream");
    check_cuda(cudaMalloc(&blas_workspace_, kBlasWorkspace), "cuBLAS workspace");
    check_blas(cublasSetWorkspace(blas_, blas_workspace_, kBlasWorkspace), "workspace");
    int device = 0;
    check_cuda(cudaGetDevice(&device), "device");
    check_cuda(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device), "multiprocessors");
    check_cuda(cudaEventCreate(&ev_start_), "timing events");
    check_cuda(cudaEventCreate(&ev_stop_), "timing events");
    if (const char* rows = std::getenv("ASTRAI_CUDA_GEMV_ROWS"))  // 16-bit weights: rows through gemv at most
      gemv_rows_16bit_ = std::clamp(std::atoi(rows), 0, kGemvMaxRows);
    const char* env = std::getenv("ASTRAI_CUDA_GRAPHS");
    graphs_ = env == nullptr || std::string(env) != "0";
  }
  ~CudaOps() override {
    for (auto& [key, step] : steps_)
      if (step.exec != nullptr) cudaGraphExecDestroy(step.exec);
    cublasDestroy(blas_);
    cudaFree(blas_workspace_);
    cudaEventDestroy(ev_start_);
    cudaEventDestroy(ev_stop_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCuda; }

  void* alloc(size_t bytes) const override { return device_alloc(bytes); }
  void release(void* p) const override { device_free(p); }
  // The legacy stream's copies wait for the backend's (blocking) stream and it for them.
  void to_device(void* dst, const void* host, size_t bytes) const override { copy_to_device(dst, host, bytes); }
  void to_host(void* host, const void* src, size_t bytes) const override { copy_to_host(host, src, bytes); }
  void copy_bytes(void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0 || dst == src || preparing()) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
  }
  void synchronize() const override { cuda::synchronize(); }

  // Decode steps as CUDA graphs: the first call of a key runs `body` (sizing every scratch
  // array), the second captures it into a graph and launches that, later ones only prepare
  // the host side (the step's index arrays into the staging places the graph copies from)
  // and replay. A prepared step whose uploads differ from the captured ones (a page table
  // that outgrew its stride, a moved buffer) runs uncached and is captured again next time.
  void run_cached(uint64_t key, const std::function<void()>& body) const override {
    std::lock_guard<std::mutex> lock(step_mu_);
    collect_timing();
    if (!graphs_) {
      const auto t0 = std::chrono::steady_clock::now();
      check_cuda(cudaEventRecord(ev_start_, stream_), "timing");
      body();
      check_cuda(cudaEventRecord(ev_stop_, stream_), "timing");
      timing_.host_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      timing_pending_ = true;
      return;
    }
    begin_step();
    auto it = steps_.find(key);
    if (it == steps_.end()) {
      evict_if_full();
      steps_.emplace(key, CachedStep{nullptr, 0, ++use_clock_});
      body();
      stager_.fit_step();  // the stream drains before the next cached step starts
      return;
    }
    CachedStep& step = it->second;
    step.last_use = ++use_clock_;
    if (step.exec != nullptr && step.generation == stager_.generation()) {
      const auto t0 = std::chrono::steady_clock::now();
      {
        ModeScope scope(*this, Mode::kPrepare);
        body();
      }
      if (stager_.prepared_matches()) {
        step.misses = 0;
        check_cuda(cudaEventRecord(ev_start_, stream_), "timing");
        check_cuda(cudaGraphLaunch(step.exec, stream_), "replaying a decode step");
        check_cuda(cudaEventRecord(ev_stop_, stream_), "timing");
        timing_.host_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        timing_pending_ = true;
        ++replays_;
        return;
      }
      drop(step);
      forget_uploads();
      if (++step.misses == kMaxMisses)
        log_warn("CUDA graphs: a decode step differed from its recorded graph ", kMaxMisses,
                 " times in a row; steps of that shape now run op by op");
      begin_step();
      body();  // uncached; captured again on the next call
      stager_.fit_step();
      return;
    }
    drop(step);
    if (step.misses >= kMaxMisses) {
      body();
      return;
    }
    capture(step, body);
  }

  void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t* d_ids = upload(ids_, std::vector<int32_t>(ids, ids + n));
    if (preparing()) return;
    const int64_t dim = table.cols;
    switch (table.dtype) {
      case DType::kF32:
        embedding_kernel<<<blocks_for(n * dim), kThreads, 0, stream_>>>(static_cast<const float*>(table.data), d_ids,
                                                                        n, dim, out);
        break;
      case DType::kBF16:
        embedding_kernel<<<blocks_for(n * dim), kThreads, 0, stream_>>>(
            static_cast<const __nv_bfloat16*>(table.data), d_ids, n, dim, out);
        break;
      case DType::kF16:
        embedding_kernel<<<blocks_for(n * dim), kThreads, 0, stream_>>>(static_cast<const __half*>(table.data), d_ids,
                                                                        n, dim, out);
        break;
      default:
        fail("CUDA embedding: unsupported table dtype ", dtype_name(table.dtype));
    }
    check_launch("embedding");
  }

  void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t* d_rows = upload(rows_, std::vector<int32_t>(rows, rows + n));
    if (preparing()) return;
    gather_kernel<<<blocks_for(n * dim), kThreads, 0, stream_>>>(x, dim, d_rows, n, out);
    check_launch("gather_rows");
  }

  // y[m, rows] = x[m, cols] · W^T: column-major, y^T = W · x^T (W stored [rows, cols] is
  // W^T in column-major with leading dimension cols).
  void linear(const float* x, int64_t m, const Weight& w, const float* bias, float* y) const override {
    if (m == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols), mm = static_cast<int>(m);
    const float one = 1.0f, zero = 0.0f;
    ASTRAI_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.dtype == DType::kF16,
                 "CUDA linear: unsupported weight dtype ", dtype_name(w.dtype));
    // Few rows (decode; kGemvMaxRows, kGemvRows16Bit): our own product over f32 activations,
    // weights read once in 16-byte loads. More rows: cuBLAS, 16-bit weights with the
    // activations rounded.
    const bool aligned = k % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if (m <= (w.dtype == DType::kF32 ? kGemvMaxRows : gemv_rows_16bit_) && aligned) {
      if (preparing()) return;
      if (w.dtype == DType::kF32)
        launch_gemv(x, m, k, static_cast<const float*>(w.data), n, bias, y, stream_);
      else if (w.dtype == DType::kBF16)
        launch_gemv(x, m, k, static_cast<const __nv_bfloat16*>(w.data), n, bias, y, stream_);
      else
        launch_gemv(x, m, k, static_cast<const __half*>(w.data), n, bias, y, stream_);
      check_launch("linear (gemv)");
      return;
    }
    const bool rounds = w.dtype == DType::kBF16 || w.dtype == DType::kF16;
    // The rounded activations' scratch is part of a cached step (noted when prepared too).
    void* xh = rounds ? scratch(half_x_, static_cast<size_t>(m * k)) : nullptr;
    if (preparing()) return;
    if (w.dtype == DType::kF32) {
      check_blas(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, mm, k, &one, static_cast<const float*>(w.data), k, x,
                             k, &zero, y, n),
                 "linear (f32)");
    } else if (rounds) {
      // The activations rounded to the weights' type; products accumulated in f32.
      const bool bf16 = w.dtype == DType::kBF16;
      if (bf16) round_kernel<<<blocks_for(m * k), kThreads, 0, stream_>>>(x, m * k, static_cast<__nv_bfloat16*>(xh));
      else round_kernel<<<blocks_for(m * k), kThreads, 0, stream_>>>(x, m * k, static_cast<__half*>(xh));
      check_launch("linear: rounding x");
      const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
      check_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, mm, k, &one, w.data, t, k, xh, t, k, &zero, y,
                              CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "linear (16-bit)");
    }
    if (bias != nullptr) {
      add_bias_kernel<<<blocks_for(m * n), kThreads, 0, stream_>>>(y, bias, m, n);
      check_launch("linear bias");
    }
  }

  void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
               float* rstd) const override {
    if (rows == 0 || preparing()) return;
    rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream_>>>(x, dim, w, eps, y, rstd);
    check_launch("rmsnorm");
  }

  void add_rmsnorm(const float* x, const float* delta, int64_t rows, int64_t dim, const float* w, float eps,
                   float* x_out, float* y, float* rstd) const override {
    if (rows == 0 || preparing()) return;
    add_rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream_>>>(x, delta, dim, w, eps, x_out, y, rstd);
    check_launch("add_rmsnorm");
  }

  void add(const float* a, const float* b, int64_t n, float* out) const override {
    if (n == 0 || preparing()) return;
    add_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(a, b, n, out);
    check_launch("add");
  }

  // The tables are computed on the host by the CPU backend (the same bits) and copied over.
  void rope_tables(const double* inv_freq, int64_t half, const int32_t* positions, int64_t n, bool f32_angle,
                   float scale, float* cos, float* sin) const override {
    std::lock_guard<std::mutex> lock(mu_);
    host_cos_.resize(static_cast<size_t>(n * half));
    host_sin_.resize(static_cast<size_t>(n * half));
    astrai::backend::cpu_ops().rope_tables(inv_freq, half, positions, n, f32_angle, scale, host_cos_.data(),
                                           host_sin_.data());
    const size_t bytes = host_cos_.size() * sizeof(float);
    stager_.put(cos, host_cos_.data(), bytes, mode_, stream_);
    stager_.put(sin, host_sin_.data(), bytes, mode_, stream_);
  }

  void rope(float* x, int64_t tokens, int64_t heads, int64_t head_stride, int64_t rot_offset, int64_t half,
            const float* cos, const float* sin, kernels::RopePairing pairing, bool inverse) const override {
    const int64_t n = tokens * heads * half;
    if (n == 0 || preparing()) return;
    rope_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, tokens, heads, head_stride, rot_offset, half, cos, sin,
                                                         pairing == kernels::RopePairing::kAdjacent, inverse);
    check_launch("rope");
  }

  void split_rows(const float* kvb, int64_t rows, int64_t k_dim, int64_t v_dim, float* k, float* v) const override {
    if (rows == 0 || preparing()) return;
    split_kernel<<<blocks_for(rows * (k_dim + v_dim)), kThreads, 0, stream_>>>(kvb, rows, k_dim, v_dim, k, v);
    check_launch("split_rows");
  }

  void kv_write(const float* k, const float* v, const SeqRange* seqs, int64_t num_seqs, const KvPages& kv,
                int64_t kv_heads, int64_t k_dim, int64_t v_dim) const override {
    ASTRAI_CHECK(kv.dtype == DType::kF32 || kv.dtype == DType::kBF16, "CUDA kv_write: pages must be f32 or bf16");
    std::lock_guard<std::mutex> lock(mu_);
    // slot of every row of the batch, in row order (rows of no sequence are not written).
    int64_t rows = 0;
    for (int64_t s = 0; s < num_seqs; ++s) rows = std::max<int64_t>(rows, seqs[s].token_begin + seqs[s].num_tokens);
    host_slots_.assign(static_cast<size_t>(rows), -1);
    for (int64_t s = 0; s < num_seqs; ++s)
      for (int32_t j = 0; j < seqs[s].num_tokens; ++j) {
        const int32_t idx = seqs[s].context_len + j;
        host_slots_[static_cast<size_t>(seqs[s].token_begin + j)] =
            seqs[s].page_table[idx / kv.page_size] * kv.page_size + idx % kv.page_size;
      }
    ASTRAI_CHECK(std::find(host_slots_.begin(), host_slots_.end(), -1) == host_slots_.end(),
                 "CUDA kv_write: the sequences must cover every row of the batch");
    const int32_t* d_slots = upload(slots_, host_slots_);
    if (preparing()) return;
    const int64_t n = rows * kv_heads * std::max(k_dim, v_dim);
    if (n == 0) return;
    if (kv.dtype == DType::kF32)
      kv_write_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(k, v, d_slots, rows, kv_heads, k_dim, v_dim,
                                                               kv.page_size, static_cast<float*>(kv.k),
                                                               static_cast<float*>(kv.v));
    else
      kv_write_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(k, v, d_slots, rows, kv_heads, k_dim, v_dim,
                                                               kv.page_size, static_cast<__nv_bfloat16*>(kv.k),
                                                               static_cast<__nv_bfloat16*>(kv.v));
    check_launch("kv_write");
  }

  // Each (query, head) is split over its keys when the batch alone would not fill the GPU
  // (decode): splits depend on the batch's shape only, never on the contexts' lengths, so a
  // captured step stays valid while they grow. Page tables go up in rows of a fixed stride
  // per sequence (the longest table rounded up to 64 pages) for the same reason.
  void attention(const float* q, const float* k, const float* v, const KvPages* kv, const SeqRange* seqs,
                 int64_t num_seqs, const AttnDims& d, float* out, float* lse) const override {
    ASTRAI_CHECK(d.qk_dim <= kWarp * kMaxPerLane && d.v_dim <= kWarp * kMaxPerLane,
                 "CUDA attention: head dims above ", kWarp * kMaxPerLane, " are not supported");
    std::lock_guard<std::mutex> lock(mu_);
    host_queries_.clear();
    host_tables_.clear();
    int64_t stride = 0;
    if (kv != nullptr) {
      for (int64_t s = 0; s < num_seqs; ++s)
        stride = std::max<int64_t>(stride, (seqs[s].context_len + seqs[s].num_tokens + kv->page_size - 1) / kv->page_size);
      stride = (stride + 63) / 64 * 64;
      host_tables_.assign(static_cast<size_t>(num_seqs * stride), 0);
    }
    for (int64_t s = 0; s < num_seqs; ++s) {
      const SeqRange& sp = seqs[s];
      const int32_t context = kv ? sp.context_len : 0;
      int32_t base = sp.token_begin;
      if (kv != nullptr) {
        base = static_cast<int32_t>(s * stride);
        const int32_t pages = (context + sp.num_tokens + kv->page_size - 1) / kv->page_size;
        std::copy(sp.page_table, sp.page_table + pages, host_tables_.begin() + base);
      }
      for (int32_t j = 0; j < sp.num_tokens; ++j)
        host_queries_.push_back(QueryDesc{sp.token_begin + j, context + j + 1, base});
    }
    if (host_queries_.empty()) return;
    const QueryDesc* d_queries = upload(queries_, host_queries_);
    const int32_t* d_tables = upload(page_tables_, host_tables_);
    const int64_t num_qh = static_cast<int64_t>(host_queries_.size()) * d.heads;
    const int64_t fill = 8 * static_cast<int64_t>(sm_count_);
    const int splits = static_cast<int>(std::clamp<int64_t>((fill + num_qh - 1) / num_qh, 1, kMaxSplits));
    float* partial = splits > 1 ? scratch(partial_, static_cast<size_t>(num_qh * splits * (d.v_dim + 2))) : nullptr;
    if (preparing()) return;
    const dim3 grid(static_cast<unsigned>(num_qh), static_cast<unsigned>(splits));
    const int32_t page_size = kv ? kv->page_size : 0;
    if (kv == nullptr || kv->dtype == DType::kF32) {
      const float* kk = kv ? static_cast<const float*>(kv->k) : k;
      const float* vv = kv ? static_cast<const float*>(kv->v) : v;
      attention_kernel<<<grid, kAttnWarps * kWarp, 0, stream_>>>(q, kk, vv, d_tables, d_queries, d.heads, d.kv_heads,
                                                                  d.qk_dim, d.v_dim, d.scale, page_size, out, lse,
                                                                  partial);
    } else {
      attention_kernel<<<grid, kAttnWarps * kWarp, 0, stream_>>>(
          q, static_cast<const __nv_bfloat16*>(kv->k), static_cast<const __nv_bfloat16*>(kv->v), d_tables, d_queries,
          d.heads, d.kv_heads, d.qk_dim, d.v_dim, d.scale, page_size, out, lse, partial);
    }
    check_launch("attention");
    if (splits > 1) {
      attention_combine_kernel<<<blocks_for(num_qh * kWarp), kThreads, 0, stream_>>>(d_queries, num_qh, d.heads,
                                                                                      d.v_dim, splits, partial, out, lse);
      check_launch("attention: combining the splits");
    }
  }

  void sigmoid(const float* x, int64_t n, float* y) const override {
    if (n == 0 || preparing()) return;
    sigmoid_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, n, y);
    check_launch("sigmoid");
  }

  void mul(const float* a, const float* b, int64_t n, float* out) const override {
    if (n == 0 || preparing()) return;
    mul_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(a, b, n, out);
    check_launch("mul");
  }

  void swiglu(const float* gate, const float* up, int64_t n, float* out) const override {
    if (n == 0 || preparing()) return;
    swiglu_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(gate, up, n, out);
    check_launch("swiglu");
  }

  void dropout(const float* x, int64_t n, float p, uint64_t seed, float* y) const override {
    if (n == 0 || preparing()) return;
    dropout_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, n, p, seed, y);
    check_launch("dropout");
  }

  void linear_backward(const float* dy, const float* x, int64_t m, const Weight& w, float* dx, bool accumulate_dx,
                       float* dw, float* db) const override {
    ASTRAI_CHECK(w.dtype == DType::kF32, "CUDA linear backward: weights must be f32, not ", dtype_name(w.dtype));
    if (m == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols), mm = static_cast<int>(m);
    const float one = 1.0f, zero = 0.0f;
    const float* W = static_cast<const float*>(w.data);
    // dx[m, k] = dy[m, n] · W[n, k]: column-major dx^T = W^T · dy^T.
    check_blas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, k, mm, n, &one, W, k, dy, n, accumulate_dx ? &one : &zero,
                           dx, k),
               "linear backward dx");
    // dw[n, k] += dy^T · x: column-major dw^T = x^T · dy.
    if (dw != nullptr)
      check_blas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, k, n, mm, &one, x, k, dy, n, &one, dw, k),
                 "linear backward dw");
    if (db != nullptr) {
      column_sum_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(dy, m, n, db);
      check_launch("linear backward db");
    }
  }

  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows, int64_t dim,
                        float* dx, bool accumulate_dx, float* dw) const override {
    if (rows == 0) return;
    // dw first: dx may overwrite dy.
    if (dw != nullptr) {
      rmsnorm_dw_kernel<<<blocks_for(dim), kThreads, 0, stream_>>>(dy, x, rstd, rows, dim, dw);
      check_launch("rmsnorm backward dw");
    }
    rmsnorm_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream_>>>(dy, x, w, rstd, dim, dx, accumulate_dx);
    check_launch("rmsnorm backward dx");
  }

  void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da,
                       float* db) const override {
    if (n == 0) return;
    swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(dh, a, b, n, da, db);
    check_launch("swiglu backward");
  }

  void gate_backward(const float* dy, const float* att, const float* g, int64_t n, float* d_att,
                     float* d_z) const override {
    if (n == 0) return;
    gate_backward_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(dy, att, g, n, d_att, d_z);
    check_launch("gate backward");
  }

  void join_rows(const float* dk, const float* dv, int64_t rows, int64_t k_dim, int64_t v_dim,
                 float* d_kvb) const override {
    if (rows == 0) return;
    join_kernel<<<blocks_for(rows * (k_dim + v_dim)), kThreads, 0, stream_>>>(dk, dv, rows, k_dim, v_dim, d_kvb);
    check_launch("join_rows");
  }

  void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const SeqRange* seqs, int64_t num_seqs, const AttnDims& d, float* dq,
                          float* dk, float* dv) const override {
    ASTRAI_CHECK(d.qk_dim <= kWarp * kMaxPerLane && d.v_dim <= kWarp * kMaxPerLane,
                 "CUDA attention backward: head dims above ", kWarp * kMaxPerLane, " are not supported");
    std::lock_guard<std::mutex> lock(mu_);
    int64_t rows = 0;
    for (int64_t s = 0; s < num_seqs; ++s) rows = std::max<int64_t>(rows, seqs[s].token_begin + seqs[s].num_tokens);
    if (rows == 0) return;
    std::vector<DocPos> pos(static_cast<size_t>(rows), DocPos{0, -1, 0});
    for (int64_t s = 0; s < num_seqs; ++s)
      for (int32_t j = 0; j < seqs[s].num_tokens; ++j)
        pos[static_cast<size_t>(seqs[s].token_begin + j)] = DocPos{seqs[s].token_begin, j, seqs[s].num_tokens};
    const DocPos* d_pos = upload(doc_pos_, pos);
    float* D = scratch(row_dot_, static_cast<size_t>(rows * d.heads));
    attn_rowdot_kernel<<<blocks_for(rows * d.heads * kWarp), kThreads, 0, stream_>>>(dout, out, rows * d.heads, d.v_dim, D);
    check_launch("attention backward: row dots");
    attn_dq_kernel<<<blocks_for(rows * d.heads * kWarp), kThreads, 0, stream_>>>(dout, q, k, v, lse, D, d_pos, rows, d.heads,
                                                                    d.kv_heads, d.qk_dim, d.v_dim, d.scale, dq);
    check_launch("attention backward: dq");
    attn_dkv_kernel<<<blocks_for(rows * d.kv_heads * kWarp), kThreads, 0, stream_>>>(dout, q, k, v, lse, D, d_pos, rows, d.heads,
                                                                        d.kv_heads, d.qk_dim, d.v_dim, d.scale, dk, dv);
    check_launch("attention backward: dk, dv");
  }

  void embedding_backward(const float* dx, const int32_t* ids, int64_t n, int64_t dim, float* d_table) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t* d_ids = upload(ids_, std::vector<int32_t>(ids, ids + n));
    embedding_backward_kernel<<<blocks_for(dim), kThreads, 0, stream_>>>(dx, d_ids, n, dim, d_table);
    check_launch("embedding backward");
  }

  void copy(const float* src, int64_t n, float* dst) const override {
    if (src == dst || n == 0 || preparing()) return;
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
               "copy");
  }

 private:
  // Backward operations and the copies run in kRun only (training never caches its steps).
  bool preparing() const { return mode_ == Mode::kPrepare; }

  template <typename T>
  const T* upload(DeviceArray<T>& array, const std::vector<T>& host) const {
    return array.upload(host, stager_, mode_, stream_);
  }
  // Room for n elements; while a step is cached no allocation happens (it would stall a
  // capture): a step that needs more runs uncached.
  template <typename T>
  T* scratch(DeviceArray<T>& array, size_t n) const {
    if (mode_ != Mode::kRun && n > array.capacity()) {
      stager_.invalidate();
      if (mode_ == Mode::kCapture) return array.data();
    }
    T* p = array.reserve(n);
    stager_.note(p, mode_);
    return p;
  }

  // Sets the mode for a scope (the previous one again on any exit).
  class ModeScope {
   public:
    ModeScope(const CudaOps& ops, Mode mode) : ops_(ops), old_(ops.mode_) { ops_.mode_ = mode; }
    ~ModeScope() { ops_.mode_ = old_; }
    ModeScope(const ModeScope&) = delete;
    ModeScope& operator=(const ModeScope&) = delete;

   private:
    const CudaOps& ops_;
    Mode old_;
  };

  // A cached step starts on a drained stream, so the staging buffer restarts at 0 and the
  // uploads land where they did when the step was captured.
  void begin_step() const {
    check_cuda(cudaStreamSynchronize(stream_), "a cached step waiting for the stream");
    stager_.begin_step();
  }

  void capture(CachedStep& step, const std::function<void()>& body) const {
    begin_step();
    stager_.start_log();
    cudaGraph_t graph = nullptr;
    {
      ModeScope scope(*this, Mode::kCapture);
      check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "capturing a decode step");
      try {
        body();
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph != nullptr) cudaGraphDestroy(graph);
        cudaGetLastError();
        forget_uploads();
        throw;
      }
      check_cuda(cudaStreamEndCapture(stream_, &graph), "ending the capture of a decode step");
    }
    if (stager_.capture_fits()) {
      const cudaError_t e = cudaGraphInstantiate(&step.exec, graph, 0);
      cudaGraphDestroy(graph);
      check_cuda(e, "instantiating a decode step's graph");
      step.generation = stager_.generation();
      check_cuda(cudaGraphLaunch(step.exec, stream_), "launching a decode step's graph");
      return;
    }
    // The capture needed more room than the run before it settled: nothing ran; run it now.
    cudaGraphDestroy(graph);
    forget_uploads();
    begin_step();
    body();
    stager_.fit_step();
  }

  // Adds the last timed step's device time (its events have completed: the caller read its
  // results back since).
  void collect_timing() const {
    if (!timing_pending_) return;
    float ms = 0;
    check_cuda(cudaEventSynchronize(ev_stop_), "timing");
    check_cuda(cudaEventElapsedTime(&ms, ev_start_, ev_stop_), "timing");
    timing_.device_seconds += ms / 1e3;
    ++timing_.steps;
    timing_pending_ = false;
  }

  void forget_uploads() const {
    ids_.forget();
    rows_.forget();
    page_tables_.forget();
    slots_.forget();
    queries_.forget();
    doc_pos_.forget();
  }

  void drop(CachedStep& step) const {
    if (step.exec != nullptr) cudaGraphExecDestroy(step.exec);
    step.exec = nullptr;
  }

  void evict_if_full() const {
    if (steps_.size() < kMaxGraphs) return;
    auto oldest = std::min_element(steps_.begin(), steps_.end(),
                                   [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    drop(oldest->second);
    steps_.erase(oldest);
  }

 public:
  void set_graphs(bool on) const {
    std::lock_guard<std::mutex> lock(step_mu_);
    graphs_ = on;
  }
  int64_t replays() const { return replays_; }
  StepTiming take_timing() const {
    std::lock_guard<std::mutex> lock(step_mu_);
    collect_timing();
    return std::exchange(timing_, StepTiming{});
  }

 private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* blas_workspace_ = nullptr;
  int sm_count_ = 1;
  int gemv_rows_16bit_ = kGemvRows16Bit;
  mutable std::mutex mu_;  // guards the scratch below
  mutable Mode mode_ = Mode::kRun;
  mutable Stager stager_;
  // One array per kind of index, so each keeps the step's values across the layers.
  mutable DeviceArray<int32_t> ids_, rows_, page_tables_, slots_;
  mutable DeviceArray<QueryDesc> queries_;
  mutable DeviceArray<DocPos> doc_pos_;
  mutable DeviceArray<float> row_dot_, partial_;
  mutable DeviceArray<uint16_t> half_x_;
  mutable std::vector<float> host_cos_, host_sin_;
  mutable std::vector<int32_t> host_slots_, host_tables_;
  mutable std::vector<QueryDesc> host_queries_;
  // Cached decode steps (run_cached).
  mutable std::mutex step_mu_;
  mutable bool graphs_ = true;
  mutable std::map<uint64_t, CachedStep> steps_;
  mutable uint64_t use_clock_ = 0;
  mutable int64_t replays_ = 0;
  // Timing of the steps run op by op or replayed (not the first or captured ones).
  cudaEvent_t ev_start_ = nullptr, ev_stop_ = nullptr;
  mutable StepTiming timing_;
  mutable bool timing_pending_ = false;
};

}  // namespace

bool available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    if (why != nullptr)
      *why = e != cudaSuccess ? std::string("no usable CUDA driver or device: ") + cudaGetErrorString(e)
                              : std::string("no CUDA device");
    return false;
  }
  return true;
}

namespace {

const CudaOps& instance() {
  std::string why;
  if (!available(&why)) fail("CUDA backend: ", why);
  static const CudaOps ops;
  return ops;
}

}  // namespace

const Ops& ops() { return instance(); }

void set_graphs(bool on) { instance().set_graphs(on); }

int64_t graph_replays() { return instance().replays(); }

StepTiming take_step_timing() { return instance().take_timing(); }

// ops_for(Device::kCuda) finds this backend in every program that links it.
const bool registered = (register_backend(Device::kCuda, &ops), true);

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "allocating device memory");
  return p;
}

void device_free(void* p) { cudaFree(p); }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy to device");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy to host");
}

void synchronize() { check_cuda(cudaDeviceSynchronize(), "synchronize"); }

}  // namespace astrai::backend::cuda
