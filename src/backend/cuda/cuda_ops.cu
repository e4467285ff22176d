// The CUDA backend: backend::Ops over device memory. Matrix products are cuBLAS (f32 SGEMM, or
// GemmEx with the activations rounded to the weights' 16-bit type and f32 accumulation);
// everything else is a plain kernel below, one per operation, written for clarity first:
// attention is one warp per (query row, head) with an online softmax over the keys, and its
// backward recomputes the probabilities from the saved log-sum-exp (dq per query, dk/dv per
// key, so nothing needs atomics and every sum has a fixed order).
//
// Index arrays arrive in host memory (ops.h); each operation copies what it needs into device
// buffers that grow and are reused. Work goes to the default stream; copies from the host
// are synchronous, so a reused index buffer is never overwritten under a running kernel.
#include "backend/cuda/cuda_ops.h"
#include "backend/dropout_mask.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/error.h"
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
template <typename T>
__global__ void kv_write_kernel(const float* src, const int32_t* slot, int64_t rows, int64_t heads, int64_t dim,
                                int64_t page_size, T* pages) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * heads * dim) return;
  const int64_t d = i % dim, h = (i / dim) % heads, r = i / (dim * heads);
  const int64_t page = slot[r] / page_size, s = slot[r] % page_size;
  const float x = src[i];
  T* dst = pages + ((page * heads + h) * page_size + s) * dim + d;
  if constexpr (sizeof(T) == 4) {
    *dst = x;
  } else {
    *dst = __float2bfloat16_rn(x);
  }
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

// One warp per (query row, head); lane l holds dims l, l + 32, ... of q and of the output.
template <typename T>
__global__ void attention_kernel(const float* q, const T* k, const T* v, const int32_t* tables,
                                 const QueryDesc* queries, int64_t num_queries, int64_t heads, int64_t kv_heads,
                                 int64_t qk_dim, int64_t v_dim, float scale, int32_t page_size, float* out,
                                 float* lse) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= num_queries * heads) return;
  const QueryDesc qd = queries[warp / heads];
  const int64_t h = warp % heads, kvh = h / (heads / kv_heads);
  const float* qr = q + (static_cast<int64_t>(qd.row) * heads + h) * qk_dim;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    qv[j] = d < qk_dim ? qr[d] : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int32_t p = 0; p < qd.kv_len; ++p) {
    const T* kr = key_row(k, tables, qd, p, kv_heads, kvh, qk_dim, page_size);
    float dot = 0.0f;
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t d = lane + j * kWarp;
      if (d < qk_dim) dot += qv[j] * to_float(kr[d]);
    }
    const float s = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, s);
    const float keep = expf(m - m_new), e = expf(s - m_new);
    l = l * keep + e;
    const T* vr = key_row(v, tables, qd, p, kv_heads, kvh, v_dim, page_size);
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t d = lane + j * kWarp;
      if (d < v_dim) acc[j] = acc[j] * keep + e * to_float(vr[d]);
    }
    m = m_new;
  }
  float* o = out + (static_cast<int64_t>(qd.row) * heads + h) * v_dim;
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + j * kWarp;
    if (d < v_dim) o[d] = acc[j] / l;
  }
  if (lse != nullptr && lane == 0) lse[static_cast<int64_t>(qd.row) * heads + h] = m + logf(l);
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

// A device array that grows on demand and is reused.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }
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
  // The host values on the device. Every layer of a forward sends the same step's indices:
  // when they equal the last upload, the device copy is reused (no synchronous copy per layer).
  const T* upload(const std::vector<T>& host) {
    const size_t bytes = host.size() * sizeof(T);
    if (data_ != nullptr && bytes == last_.size() && std::memcmp(host.data(), last_.data(), bytes) == 0) return data_;
    T* d = reserve(std::max<size_t>(host.size(), 1));
    if (bytes > 0) check_cuda(cudaMemcpy(d, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
    last_.assign(reinterpret_cast<const char*>(host.data()), reinterpret_cast<const char*>(host.data()) + bytes);
    return d;
  }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
  std::vector<char> last_;  // the bytes last uploaded
};

class CudaOps final : public Ops {
 public:
  CudaOps() {
    check_blas(cublasCreate(&blas_), "create handle");
    check_blas(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "math mode (no TF32)");
  }
  ~CudaOps() override { cublasDestroy(blas_); }

  Device device() const override { return Device::kCuda; }

  void* alloc(size_t bytes) const override { return device_alloc(bytes); }
  void release(void* p) const override { device_free(p); }
  void to_device(void* dst, const void* host, size_t bytes) const override { copy_to_device(dst, host, bytes); }
  void to_host(void* host, const void* src, size_t bytes) const override { copy_to_host(host, src, bytes); }
  void copy_bytes(void* dst, const void* src, size_t bytes) const override {
    if (bytes > 0 && dst != src) check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy");
  }
  void synchronize() const override { cuda::synchronize(); }

  void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t* d_ids = ids_.upload(std::vector<int32_t>(ids, ids + n));
    const int64_t dim = table.cols;
    switch (table.dtype) {
      case DType::kF32:
        embedding_kernel<<<blocks_for(n * dim), kThreads>>>(static_cast<const float*>(table.data), d_ids, n, dim, out);
        break;
      case DType::kBF16:
        embedding_kernel<<<blocks_for(n * dim), kThreads>>>(static_cast<const __nv_bfloat16*>(table.data), d_ids, n,
                                                            dim, out);
        break;
      case DType::kF16:
        embedding_kernel<<<blocks_for(n * dim), kThreads>>>(static_cast<const __half*>(table.data), d_ids, n, dim, out);
        break;
      default:
        fail("CUDA embedding: unsupported table dtype ", dtype_name(table.dtype));
    }
    check_launch("embedding");
  }

  void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t* d_rows = ids_.upload(std::vector<int32_t>(rows, rows + n));
    gather_kernel<<<blocks_for(n * dim), kThreads>>>(x, dim, d_rows, n, out);
    check_launch("gather_rows");
  }

  // y[m, rows] = x[m, cols] · W^T: column-major, y^T = W · x^T (W stored [rows, cols] is
  // W^T in column-major with leading dimension cols).
  void linear(const float* x, int64_t m, const Weight& w, const float* bias, float* y) const override {
    if (m == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols), mm = static_cast<int>(m);
    const float one = 1.0f, zero = 0.0f;
    if (w.dtype == DType::kF32) {
      check_blas(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, mm, k, &one, static_cast<const float*>(w.data), k, x,
                             k, &zero, y, n),
                 "linear (f32)");
    } else if (w.dtype == DType::kBF16 || w.dtype == DType::kF16) {
      // The activations rounded to the weights' type; products accumulated in f32.
      const bool bf16 = w.dtype == DType::kBF16;
      void* xh = half_x_.reserve(static_cast<size_t>(m * k));
      if (bf16) round_kernel<<<blocks_for(m * k), kThreads>>>(x, m * k, static_cast<__nv_bfloat16*>(xh));
      else round_kernel<<<blocks_for(m * k), kThreads>>>(x, m * k, static_cast<__half*>(xh));
      check_launch("linear: rounding x");
      const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
      check_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, mm, k, &one, w.data, t, k, xh, t, k, &zero, y,
                              CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "linear (16-bit)");
    } else {
      fail("CUDA linear: unsupported weight dtype ", dtype_name(w.dtype));
    }
    if (bias != nullptr) {
      add_bias_kernel<<<blocks_for(m * n), kThreads>>>(y, bias, m, n);
      check_launch("linear bias");
    }
  }

  void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
               float* rstd) const override {
    if (rows == 0) return;
    rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads>>>(x, dim, w, eps, y, rstd);
    check_launch("rmsnorm");
  }

  void add_rmsnorm(const float* x, const float* delta, int64_t rows, int64_t dim, const float* w, float eps,
                   float* x_out, float* y, float* rstd) const override {
    add(x, delta, rows * dim, x_out);
    rmsnorm(x_out, rows, dim, w, eps, y, rstd);
  }

  void add(const float* a, const float* b, int64_t n, float* out) const override {
    if (n == 0) return;
    add_kernel<<<blocks_for(n), kThreads>>>(a, b, n, out);
    check_launch("add");
  }

  // The tables are computed on the host by the CPU backend (the same bits) and copied over.
  void rope_tables(const double* inv_freq, int64_t half, const int32_t* positions, int64_t n, bool f32_angle,
                   float scale, float* cos, float* sin) const override {
    std::lock_guard<std::mutex> lock(mu_);
    host_cos_.resize(static_cast<size_t>(n * half));
    host_sin_.resize(static_cast<size_t>(n * half));
    astrai::backend::cpu_ops().rope_tables(inv_freq, half, positions, n, f32_angle, scale, host_cos_.data(), host_sin_.data());
    const size_t bytes = host_cos_.size() * sizeof(float);
    check_cuda(cudaMemcpy(cos, host_cos_.data(), bytes, cudaMemcpyHostToDevice), "rope tables");
    check_cuda(cudaMemcpy(sin, host_sin_.data(), bytes, cudaMemcpyHostToDevice), "rope tables");
  }

  void rope(float* x, int64_t tokens, int64_t heads, int64_t head_stride, int64_t rot_offset, int64_t half,
            const float* cos, const float* sin, kernels::RopePairing pairing, bool inverse) const override {
    const int64_t n = tokens * heads * half;
    if (n == 0) return;
    rope_kernel<<<blocks_for(n), kThreads>>>(x, tokens, heads, head_stride, rot_offset, half, cos, sin,
                                            pairing == kernels::RopePairing::kAdjacent, inverse);
    check_launch("rope");
  }

  void split_rows(const float* kvb, int64_t rows, int64_t k_dim, int64_t v_dim, float* k, float* v) const override {
    if (rows == 0) return;
    split_kernel<<<blocks_for(rows * (k_dim + v_dim)), kThreads>>>(kvb, rows, k_dim, v_dim, k, v);
    check_launch("split_rows");
  }

  void kv_write(const float* k, const float* v, const SeqRange* seqs, int64_t num_seqs, const KvPages& kv,
                int64_t kv_heads, int64_t k_dim, int64_t v_dim) const override {
    std::lock_guard<std::mutex> lock(mu_);
    // slot of every row of the batch, in row order (rows of no sequence are not written).
    std::vector<int32_t> slots;
    int64_t rows = 0;
    for (int64_t s = 0; s < num_seqs; ++s) rows = std::max<int64_t>(rows, seqs[s].token_begin + seqs[s].num_tokens);
    slots.assign(static_cast<size_t>(rows), -1);
    for (int64_t s = 0; s < num_seqs; ++s)
      for (int32_t j = 0; j < seqs[s].num_tokens; ++j) {
        const int32_t idx = seqs[s].context_len + j;
        slots[static_cast<size_t>(seqs[s].token_begin + j)] =
            seqs[s].page_table[idx / kv.page_size] * kv.page_size + idx % kv.page_size;
      }
    ASTRAI_CHECK(std::find(slots.begin(), slots.end(), -1) == slots.end(),
                 "CUDA kv_write: the sequences must cover every row of the batch");
    const int32_t* d_slots = slots_.upload(slots);
    auto write = [&](const float* src, void* pages, int64_t dim) {
      const int64_t n = rows * kv_heads * dim;
      if (n == 0) return;
      if (kv.dtype == DType::kF32)
        kv_write_kernel<<<blocks_for(n), kThreads>>>(src, d_slots, rows, kv_heads, dim, kv.page_size,
                                                     static_cast<float*>(pages));
      else
        kv_write_kernel<<<blocks_for(n), kThreads>>>(src, d_slots, rows, kv_heads, dim, kv.page_size,
                                                     static_cast<__nv_bfloat16*>(pages));
      check_launch("kv_write");
    };
    ASTRAI_CHECK(kv.dtype == DType::kF32 || kv.dtype == DType::kBF16, "CUDA kv_write: pages must be f32 or bf16");
    write(k, kv.k, k_dim);
    write(v, kv.v, v_dim);
  }

  void attention(const float* q, const float* k, const float* v, const KvPages* kv, const SeqRange* seqs,
                 int64_t num_seqs, const AttnDims& d, float* out, float* lse) const override {
    ASTRAI_CHECK(d.qk_dim <= kWarp * kMaxPerLane && d.v_dim <= kWarp * kMaxPerLane,
                 "CUDA attention: head dims above ", kWarp * kMaxPerLane, " are not supported");
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<QueryDesc> queries;
    std::vector<int32_t> tables;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const SeqRange& sp = seqs[s];
      const int32_t context = kv ? sp.context_len : 0;
      int32_t base = sp.token_begin;
      if (kv != nullptr) {
        base = static_cast<int32_t>(tables.size());
        const int32_t pages = (context + sp.num_tokens + kv->page_size - 1) / kv->page_size;
        tables.insert(tables.end(), sp.page_table, sp.page_table + pages);
      }
      for (int32_t j = 0; j < sp.num_tokens; ++j) queries.push_back(QueryDesc{sp.token_begin + j, context + j + 1, base});
    }
    if (queries.empty()) return;
    const QueryDesc* d_queries = queries_.upload(queries);
    const int32_t* d_tables = page_tables_.upload(tables);
    const int64_t nq = static_cast<int64_t>(queries.size());
    const unsigned blocks = blocks_for(nq * d.heads * kWarp);
    if (kv == nullptr || kv->dtype == DType::kF32) {
      const float* kk = kv ? static_cast<const float*>(kv->k) : k;
      const float* vv = kv ? static_cast<const float*>(kv->v) : v;
      attention_kernel<<<blocks, kThreads>>>(q, kk, vv, d_tables, d_queries, nq, d.heads, d.kv_heads, d.qk_dim, d.v_dim,
                                             d.scale, kv ? kv->page_size : 0, out, lse);
    } else {
      attention_kernel<<<blocks, kThreads>>>(q, static_cast<const __nv_bfloat16*>(kv->k),
                                             static_cast<const __nv_bfloat16*>(kv->v), d_tables, d_queries, nq, d.heads,
                                             d.kv_heads, d.qk_dim, d.v_dim, d.scale, kv->page_size, out, lse);
    }
    check_launch("attention");
  }

  void sigmoid(const float* x, int64_t n, float* y) const override {
    if (n == 0) return;
    sigmoid_kernel<<<blocks_for(n), kThreads>>>(x, n, y);
    check_launch("sigmoid");
  }

  void mul(const float* a, const float* b, int64_t n, float* out) const override {
    if (n == 0) return;
    mul_kernel<<<blocks_for(n), kThreads>>>(a, b, n, out);
    check_launch("mul");
  }

  void swiglu(const float* gate, const float* up, int64_t n, float* out) const override {
    if (n == 0) return;
    swiglu_kernel<<<blocks_for(n), kThreads>>>(gate, up, n, out);
    check_launch("swiglu");
  }

  void dropout(const float* x, int64_t n, float p, uint64_t seed, float* y) const override {
    if (n == 0) return;
    dropout_kernel<<<blocks_for(n), kThreads>>>(x, n, p, seed, y);
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
      column_sum_kernel<<<blocks_for(n), kThreads>>>(dy, m, n, db);
      check_launch("linear backward db");
    }
  }

  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows, int64_t dim,
                        float* dx, bool accumulate_dx, float* dw) const override {
    if (rows == 0) return;
    // dw first: dx may overwrite dy.
    if (dw != nullptr) {
      rmsnorm_dw_kernel<<<blocks_for(dim), kThreads>>>(dy, x, rstd, rows, dim, dw);
      check_launch("rmsnorm backward dw");
    }
    rmsnorm_dx_kernel<<<static_cast<unsigned>(rows), kThreads>>>(dy, x, w, rstd, dim, dx, accumulate_dx);
    check_launch("rmsnorm backward dx");
  }

  void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da,
                       float* db) const override {
    if (n == 0) return;
    swiglu_backward_kernel<<<blocks_for(n), kThreads>>>(dh, a, b, n, da, db);
    check_launch("swiglu backward");
  }

  void gate_backward(const float* dy, const float* att, const float* g, int64_t n, float* d_att,
                     float* d_z) const override {
    if (n == 0) return;
    gate_backward_kernel<<<blocks_for(n), kThreads>>>(dy, att, g, n, d_att, d_z);
    check_launch("gate backward");
  }

  void join_rows(const float* dk, const float* dv, int64_t rows, int64_t k_dim, int64_t v_dim,
                 float* d_kvb) const override {
    if (rows == 0) return;
    join_kernel<<<blocks_for(rows * (k_dim + v_dim)), kThreads>>>(dk, dv, rows, k_dim, v_dim, d_kvb);
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
    const DocPos* d_pos = doc_pos_.upload(pos);
    float* D = row_dot_.reserve(static_cast<size_t>(rows * d.heads));
    attn_rowdot_kernel<<<blocks_for(rows * d.heads * kWarp), kThreads>>>(dout, out, rows * d.heads, d.v_dim, D);
    check_launch("attention backward: row dots");
    attn_dq_kernel<<<blocks_for(rows * d.heads * kWarp), kThreads>>>(dout, q, k, v, lse, D, d_pos, rows, d.heads,
                                                                    d.kv_heads, d.qk_dim, d.v_dim, d.scale, dq);
    check_launch("attention backward: dq");
    attn_dkv_kernel<<<blocks_for(rows * d.kv_heads * kWarp), kThreads>>>(dout, q, k, v, lse, D, d_pos, rows, d.heads,
                                                                        d.kv_heads, d.qk_dim, d.v_dim, d.scale, dk, dv);
    check_launch("attention backward: dk, dv");
  }

  void embedding_backward(const float* dx, const int32_t* ids, int64_t n, int64_t dim, float* d_table) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t* d_ids = ids_.upload(std::vector<int32_t>(ids, ids + n));
    embedding_backward_kernel<<<blocks_for(dim), kThreads>>>(dx, d_ids, n, dim, d_table);
    check_launch("embedding backward");
  }

  void copy(const float* src, int64_t n, float* dst) const override {
    if (src == dst || n == 0) return;
    check_cuda(cudaMemcpy(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice), "copy");
  }

 private:
  cublasHandle_t blas_ = nullptr;
  mutable std::mutex mu_;  // guards the scratch below
  // One array per kind of index, so each keeps the step's values across the layers.
  mutable DeviceArray<int32_t> ids_, page_tables_, slots_;
  mutable DeviceArray<QueryDesc> queries_;
  mutable DeviceArray<DocPos> doc_pos_;
  mutable DeviceArray<float> row_dot_;
  mutable DeviceArray<uint16_t> half_x_;
  mutable std::vector<float> host_cos_, host_sin_;
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

const Ops& ops() {
  std::string why;
  if (!available(&why)) fail("CUDA backend: ", why);
  static const CudaOps instance;
  return instance;
}

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
