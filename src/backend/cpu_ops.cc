// The CPU backend: each operation is a call into the kernel table (kernels/cpu/dispatch.h,
// the level picked at start), or a plain loop for the data movement that has no kernel.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cblas.h>

#include "backend/dropout_mask.h"
#include "backend/ops.h"
#include "backend/sample_rows.h"
#include "base/error.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/cross_entropy_backward.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear_backward.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rmsnorm_backward.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu_backward.h"

namespace astrai::backend {

namespace {

kernels::WeightView view(const Weight& w) { return kernels::WeightView{w.data, w.dtype, w.rows, w.cols}; }

kernels::AttentionDims attention_dims(const AttnDims& d) {
  return kernels::AttentionDims{d.heads, d.kv_heads, d.qk_dim, d.v_dim, d.scale};
}

// Parallel loops only when there is enough work to pay for waking the team (decode steps
// move a few hundred floats).
constexpr int64_t kParallelMin = 1 << 14;

// dx (+)= dy · W for a bf16/f16 W [n, k] (a frozen base read where it is mapped): W is
// converted to f32 a block of rows at a time into a buffer that grows once, then SGEMM.
void linear_backward_dx_lowp(const float* dy, int64_t m, const Weight& w, float* dx, bool accumulate_dx) {
  constexpr int64_t kRows = 128;
  thread_local std::vector<float> block;
  const int64_t n = w.rows, k = w.cols;
  block.resize(static_cast<size_t>(std::min(n, kRows) * k));
  const auto* bytes = static_cast<const uint8_t*>(w.data);
  for (int64_t n0 = 0; n0 < n; n0 += kRows) {
    const int64_t rows = std::min(kRows, n - n0);
    convert_to_f32(w.dtype, bytes + dtype_bytes(w.dtype, n0 * k), block.data(),
                   static_cast<size_t>(rows * k));
    const float beta = n0 == 0 && !accumulate_dx ? 0.0f : 1.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(k),
                static_cast<int>(rows), 1.0f, dy + n0, static_cast<int>(n), block.data(), static_cast<int>(k), beta,
                dx, static_cast<int>(k));
  }
}

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::kCpu; }

  void* alloc(size_t bytes) const override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    ASTRAI_CHECK(p != nullptr, "out of memory allocating ", bytes, " bytes");
    return p;
  }
  void release(void* p) const override { std::free(p); }
  void to_device(void* dst, const void* host, size_t bytes) const override { copy_bytes(dst, host, bytes); }
  void to_host(void* host, const void* src, size_t bytes) const override { copy_bytes(host, src, bytes); }
  void copy_bytes(void* dst, const void* src, size_t bytes) const override {
    if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  }
  void synchronize() const override {}  // every CPU operation has returned when it is done

  void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) const override {
    kernels::embedding(table.data, table.dtype, table.cols, ids, n, out);
  }

  void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out) const override {
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(out + r * dim, x + static_cast<int64_t>(rows[r]) * dim, static_cast<size_t>(dim) * sizeof(float));
  }

  void linear(const float* x, int64_t m, const Weight& w, const float* bias, float* y) const override {
    kernels::linear(x, m, view(w), bias, y);
  }

  void linear_group(const float* x, int64_t m, const LinearTarget* targets, int64_t n) const override {
    std::array<kernels::LinearOut, 8> outs;
    for (int64_t i0 = 0; i0 < n; i0 += static_cast<int64_t>(outs.size())) {
      const int64_t c = std::min<int64_t>(static_cast<int64_t>(outs.size()), n - i0);
      for (int64_t i = 0; i < c; ++i) outs[i] = {view(targets[i0 + i].w), targets[i0 + i].bias, targets[i0 + i].y};
      kernels::linear_group(x, m, outs.data(), c);
    }
  }

  void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
               float* rstd) const override {
    if (rstd == nullptr) {
      kernels::rmsnorm(x, rows, dim, w, eps, y);
    } else {
      ASTRAI_CHECK(x != y, "rmsnorm: saving rstd needs an output apart from the input");
      kernels::rmsnorm_forward_train(x, w, rows, dim, eps, y, rstd);
    }
  }

  void add_rmsnorm(const float* x, const float* delta, int64_t rows, int64_t dim, const float* w, float eps,
                   float* x_out, float* y, float* rstd) const override {
    if (x_out == x && rstd == nullptr) {  // in place: one pass (the inference residual stream)
      kernels::add_rmsnorm(x_out, delta, rows, dim, w, eps, y);
      return;
    }
    add(x, delta, rows * dim, x_out);
    rmsnorm(x_out, rows, dim, w, eps, y, rstd);
  }

  void add(const float* a, const float* b, int64_t n, float* out) const override {
    if (out == a) {
      kernels::add_inplace(out, b, n);
    } else if (out == b) {
      kernels::add_inplace(out, a, n);  // a + b == b + a, bit for bit
    } else {
      copy(a, n, out);
      kernels::add_inplace(out, b, n);
    }
  }

  void rope_tables(const double* inv_freq, int64_t half, const int32_t* positions, int64_t n, bool f32_angle,
                   float scale, float* cos, float* sin) const override {
    kernels::rope_sincos(inv_freq, half, positions, n, f32_angle, cos, sin);
    if (scale == 1.0f) return;
    for (int64_t i = 0; i < n * half; ++i) {
      cos[i] *= scale;
      sin[i] *= scale;
    }
  }

  void rope(float* x, int64_t tokens, int64_t heads, int64_t head_stride, int64_t rot_offset, int64_t half,
            const float* cos, const float* sin, kernels::RopePairing pairing, bool inverse) const override {
    kernels::rope_rotate(x, tokens, heads, head_stride, rot_offset, half, cos, sin, pairing, inverse);
  }

  void split_rows(const float* kvb, int64_t rows, int64_t k_dim, int64_t v_dim, float* k, float* v) const override {
    const int64_t row = k_dim + v_dim;
#pragma omp parallel for schedule(static) if (rows * row >= kParallelMin)
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(k + i * k_dim, kvb + i * row, sizeof(float) * static_cast<size_t>(k_dim));
      std::memcpy(v + i * v_dim, kvb + i * row + k_dim, sizeof(float) * static_cast<size_t>(v_dim));
    }
  }

  void kv_write(const float* k, const float* v, const SeqRange* seqs, int64_t num_seqs, const KvPages& kv,
                int64_t kv_heads, int64_t k_dim, int64_t v_dim) const override {
    const int64_t ps = kv.page_size;
    const size_t esz = dtype_size(kv.dtype);
    // One row of `n` floats into element `at` of a page array, converted to the cache's dtype.
    auto store = [&](const float* row, void* base, int64_t at, int64_t n) {
      convert_from_f32(row, kv.dtype, static_cast<char*>(base) + static_cast<size_t>(at) * esz, static_cast<size_t>(n));
    };
    for (int64_t s = 0; s < num_seqs; ++s) {
      const SeqRange& sp = seqs[s];
      for (int64_t j = 0; j < sp.num_tokens; ++j) {
        const int64_t idx = sp.context_len + j;
        const int64_t page = sp.page_table[idx / ps], slot = idx % ps;
        const int64_t row = sp.token_begin + j;
        for (int64_t h = 0; h < kv_heads; ++h) {  // head-major pages (model/batch.h)
          store(k + (row * kv_heads + h) * k_dim, kv.k, ((page * kv_heads + h) * ps + slot) * k_dim, k_dim);
          store(v + (row * kv_heads + h) * v_dim, kv.v, ((page * kv_heads + h) * ps + slot) * v_dim, v_dim);
        }
      }
    }
  }

  void attention(const float* q, const float* k, const float* v, const KvPages* kv, const SeqRange* seqs,
                 int64_t num_seqs, const AttnDims& d, float* out, float* lse) const override {
    // Reused per calling thread: no allocation once grown.
    thread_local std::vector<kernels::AttentionSeq> list;
    thread_local kernels::AttentionScratch scratch;
    list.clear();
    for (int64_t s = 0; s < num_seqs; ++s) {
      const SeqRange& sp = seqs[s];
      list.push_back(kv ? kernels::AttentionSeq{sp.token_begin, sp.num_tokens, sp.context_len, sp.page_table}
                        : kernels::AttentionSeq{sp.token_begin, sp.num_tokens, 0, nullptr});
    }
    const kernels::KvSource src = kv ? kernels::KvSource{kv->k, kv->v, kv->page_size, kv->dtype == DType::kBF16}
                                     : kernels::KvSource{k, v, 0};
    kernels::attention(q, src, list.data(), num_seqs, attention_dims(d), out, scratch, lse);
  }

  void sigmoid(const float* x, int64_t n, float* y) const override { kernels::sigmoid_forward(x, n, y); }

  void mul(const float* a, const float* b, int64_t n, float* out) const override {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
  }

  void swiglu(const float* gate, const float* up, int64_t n, float* out) const override {
    kernels::swiglu(gate, up, n, out);
  }

  void linear_backward(const float* dy, const float* x, int64_t m, const Weight& w, float* dx, bool accumulate_dx,
                       float* dw, float* db) const override {
    if (w.dtype == DType::kF32)
      return kernels::linear_backward_f32(dy, x, m, w.f32(), w.rows, w.cols, dx, accumulate_dx, dw, db);
    ASTRAI_CHECK(dw == nullptr && db == nullptr, "linear backward: a ", dtype_name(w.dtype),
                 " weight is frozen (its gradient is formed for f32 weights only)");
    if (m > 0 && dx != nullptr) linear_backward_dx_lowp(dy, m, w, dx, accumulate_dx);
  }

  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows, int64_t dim,
                        float* dx, bool accumulate_dx, float* dw) const override {
    kernels::rmsnorm_backward(dy, x, w, rstd, rows, dim, dx, accumulate_dx, dw);
  }

  void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da,
                       float* db) const override {
    kernels::swiglu_backward(dh, a, b, n, da, db);
  }

  void gate_backward(const float* dy, const float* att, const float* g, int64_t n, float* d_att,
                     float* d_z) const override {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i], dyi = dy[i];
      d_att[i] = dyi * gi;
      d_z[i] = dyi * att[i] * gi * (1.0f - gi);
    }
  }

  void join_rows(const float* dk, const float* dv, int64_t rows, int64_t k_dim, int64_t v_dim,
                 float* d_kvb) const override {
    const int64_t row = k_dim + v_dim;
#pragma omp parallel for schedule(static) if (rows * row >= kParallelMin)
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(d_kvb + i * row, dk + i * k_dim, sizeof(float) * static_cast<size_t>(k_dim));
      std::memcpy(d_kvb + i * row + k_dim, dv + i * v_dim, sizeof(float) * static_cast<size_t>(v_dim));
    }
  }

  void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const SeqRange* seqs, int64_t num_seqs, const AttnDims& d, float* dq,
                          float* dk, float* dv) const override {
    thread_local std::vector<kernels::AttnSpan> spans;
    spans.clear();
    for (int64_t s = 0; s < num_seqs; ++s) spans.push_back(kernels::AttnSpan{seqs[s].token_begin, seqs[s].num_tokens});
    const kernels::AttnShape shape{d.heads, d.kv_heads, d.qk_dim, d.v_dim, d.scale};
    kernels::attention_backward(dout, q, k, v, out, lse, spans, shape, dq, dk, dv);
  }

  void embedding_backward(const float* dx, const int32_t* ids, int64_t n, int64_t dim, float* d_table) const override {
    // Parallel over feature columns so each column's sum runs in row order on one thread
    // (deterministic, no atomics).
    const int64_t chunk = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < dim; c0 += chunk) {
      const int64_t c1 = std::min(dim, c0 + chunk);
      for (int64_t t = 0; t < n; ++t) {
        float* dst = d_table + static_cast<int64_t>(ids[t]) * dim;
        const float* src = dx + t * dim;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }

  void dropout(const float* x, int64_t n, float p, uint64_t seed, float* y) const override {
    const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] = dropout_keep(seed, i, p) ? x[i] * scale : 0.0f;
  }

  void copy(const float* src, int64_t n, float* dst) const override {
    if (src != dst) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }

  void zero(float* x, size_t n) const override {
    if (n > 0) std::memset(x, 0, n * sizeof(float));
  }

  double cross_entropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float label_smoothing,
                       float grad_scale, float* row_loss, float* dlogits) const override {
    return kernels::cross_entropy_forward_backward(logits, targets, rows, vocab, label_smoothing, grad_scale, row_loss,
                                                   dlogits);
  }

  // Each range in order in one thread: the same sums for any thread count.
  void sum_squares(const FloatRange* ranges, size_t count, const float* x, double* out) const override {
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < count; ++b) {
      double s = 0.0;
      for (size_t i = ranges[b].begin; i < ranges[b].end; ++i) s += static_cast<double>(x[i]) * x[i];
      out[b] = s;
    }
  }

  void scale(float* x, size_t n, float c) const override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) x[i] *= c;
  }

  void sample(const float* logits, int64_t rows, int64_t vocab, const SampleSpec* specs, int64_t n,
              SampleResult* out) const override {
    check_sample_specs(specs, n, rows);
    // One thread's block (the result does not depend on the block's size); scratch kept per
    // thread, grown to the largest vocabulary seen.
    thread_local sampling::Shared shared;
    thread_local std::vector<float> w;
    thread_local std::vector<uint64_t> keys;
    thread_local std::vector<double> blocks;
    w.resize(static_cast<size_t>(vocab));
    keys.resize(static_cast<size_t>(sampling::pow2_at_least(vocab)));
    blocks.resize(static_cast<size_t>(vocab / sampling::kDrawBlock + 1));
    const sampling::RowScratch scratch{w.data(), keys.data(), blocks.data()};
    const sampling::HostBlock block{1};
    for (int64_t i = 0; i < n; ++i) {
      out[i] = SampleResult{};
      sampling::sample_row(block, shared, logits + specs[i].row * vocab, vocab, specs[i], scratch, out[i]);
    }
  }

  void adamw(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s) const override {
    const float b1 = s.beta1, b2 = s.beta2, eps = s.eps, decay = s.decay, step_size = s.step_size;
    const float bc2_sqrt = s.bc2_sqrt;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      p[i] *= decay;
      m[i] = b1 * m[i] + (1.0f - b1) * gi;
      v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      p[i] -= step_size * (m[i] / denom);
    }
  }
};

}  // namespace

const Ops& cpu_ops() {
  static const CpuOps ops;
  return ops;
}

}  // namespace astrai::backend
