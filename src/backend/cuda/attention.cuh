// The CUDA backend's attention: the forward over paged K/V or the batch's own rows, split
// over the keys for small batches (flash-decoding) with the splits merged by a second kernel,
// and the backward (probabilities recomputed from the saved log-sum-exp; dq per query, dk/dv
// per key, no atomics).
#pragma once

#include <cmath>

#include "backend/cuda/common.cuh"

namespace astrai::backend::cuda {
namespace {

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

}  // namespace
}  // namespace astrai::backend::cuda
