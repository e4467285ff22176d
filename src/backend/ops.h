// The operations a model runs, as one interface per device (the seam below the model): the
// layer sequence (model/layer.h) and the forward/backward drivers call only these, so a new
// device is a new Ops, not a new copy of the model.
//
// Memory: every `float*` is an activation or gradient buffer in the backend's device memory;
// Weight::data is a parameter in that memory too. Index arrays (token ids, row lists, sequence
// ranges and their page tables) are host memory: a device backend copies them as it needs.
// Every operation is deterministic. On the CPU every one is also batch invariant: a row's
// result depends on that row's own inputs only, so training's forward and inference's forward
// get the same bits. The CUDA backend's attention splits a row's keys by the shape of the
// batch (how many query rows share the launch), so there its bits can depend on that shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "backend/sampling.h"
#include "kernels/rope_pairing.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace astrai::backend {

// A parameter as stored: a matrix [rows (out), cols (in)] in f32/bf16/f16, or a vector
// (cols == 1). Vectors (norms, biases) are always f32.
struct Weight {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;

  bool defined() const { return data != nullptr; }
  // The f32 values of a vector, or null when the parameter is absent.
  const float* f32() const { return static_cast<const float*>(data); }
};

// A view of a tensor (matrix or vector) without owning it.
inline Weight weight_of(const Tensor& t) {
  if (!t.defined()) return {};
  return Weight{t.raw(), t.dtype(), t.dim(0), t.ndim() > 1 ? t.dim(1) : 1};
}

// One product of a linear_group: y = x · W^T (+ bias).
struct LinearTarget {
  Weight w;
  const float* bias = nullptr;
  float* y = nullptr;
};

// Query heads h reads kv head h / (heads / kv_heads).
struct AttnDims {
  int64_t heads = 0, kv_heads = 0, qk_dim = 0, v_dim = 0;
  float scale = 1.0f;  // applied to q·k
};

// One sequence of a packed batch: rows [token_begin, token_begin + num_tokens) are its new
// tokens at positions context_len.. ; with a paged cache, page_table maps its positions
// [0, context_len + num_tokens) to pages (training and cache-less runs: context_len 0, no table).
struct SeqRange {
  int32_t token_begin = 0;
  int32_t num_tokens = 0;
  int32_t context_len = 0;
  const int32_t* page_table = nullptr;
};

// One layer's paged K/V cache: head-major pages (model/batch.h), elements f32 or bf16.
struct KvPages {
  void* k = nullptr;
  void* v = nullptr;
  int32_t page_size = 0;
  DType dtype = DType::kF32;
};

// Floats [begin, end) of a flat buffer.
struct FloatRange {
  size_t begin = 0, end = 0;
};

// The constants of one AdamW update (train/optimizer.cc computes them from the step count).
struct AdamWStep {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float step_size = 0.0f;  // lr / (1 − beta1^t)
  float bc2_sqrt = 1.0f;   // sqrt(1 − beta2^t)
  float decay = 1.0f;      // 1 − lr · weight_decay for decayed parameters, else 1
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;

  // ---- memory of this backend's device ----
  virtual void* alloc(size_t bytes) const = 0;  // uninitialised; 64-byte aligned at least
  virtual void release(void* p) const = 0;      // null is fine
  virtual void to_device(void* dst, const void* host, size_t bytes) const = 0;
  virtual void to_host(void* host, const void* src, size_t bytes) const = 0;
  virtual void copy_bytes(void* dst, const void* src, size_t bytes) const = 0;  // within the device
  // Returns once every operation issued so far has finished (device work may be asynchronous;
  // to_host also waits for it).
  virtual void synchronize() const = 0;
  // Runs `body`, a sequence of this backend's operations. A backend may record what the body
  // issues for `key` and, on later calls with that key, redo only the host side of the body
  // and replay the recording (the CUDA backend's graphs): the body must then issue the same
  // operations on the same buffers with the same sizes; only the contents of index arrays
  // (token ids, positions, page tables) may change. Without a recording it just runs.
  virtual void run_cached(uint64_t key, const std::function<void()>& body) const {
    (void)key;
    body();
  }

  // ---- forward ----
  // out[i, :] = table[ids[i], :] in f32.
  virtual void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) const = 0;
  // out[i, :] = x[rows[i], :] (rows of width dim).
  virtual void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out) const = 0;
  // y[m, rows] = x[m, cols] · W^T (+ bias).
  virtual void linear(const float* x, int64_t m, const Weight& w, const float* bias, float* y) const = 0;
  // Several products of one x (q, k, v; gate, up), each equal to its linear(); a backend may run
  // them as one job.
  virtual void linear_group(const float* x, int64_t m, const LinearTarget* targets, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) linear(x, m, targets[i].w, targets[i].bias, targets[i].y);
  }
  // y = rmsnorm(x) · w per row of dim; rstd (may be null) receives 1 / sqrt(mean(x²) + eps)
  // per row for the backward. y may alias x only when rstd is null.
  virtual void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
                       float* rstd) const = 0;
  // The residual add and the norm after it: x_out = x + delta, y = rmsnorm(x_out) (rstd as
  // above). x_out may alias x; y aliases neither.
  virtual void add_rmsnorm(const float* x, const float* delta, int64_t rows, int64_t dim, const float* w, float eps,
                           float* x_out, float* y, float* rstd) const = 0;
  // out = a + b elementwise (out may alias a or b).
  virtual void add(const float* a, const float* b, int64_t n, float* out) const = 0;
  // RoPE tables [n, half] for the given inverse frequencies (kernels/cpu/rope.h's rope_sincos),
  // each entry then multiplied by scale in f32 (YaRN's attention factor; 1 leaves them as they are).
  virtual void rope_tables(const double* inv_freq, int64_t half, const int32_t* positions, int64_t n, bool f32_angle,
                           float scale, float* cos, float* sin) const = 0;
  // Rotates dims [rot_offset, rot_offset + 2·half) of each head of x[tokens, heads, head_stride]
  // in place; inverse rotates back (the backward).
  virtual void rope(float* x, int64_t tokens, int64_t heads, int64_t head_stride, int64_t rot_offset, int64_t half,
                    const float* cos, const float* sin, kernels::RopePairing pairing, bool inverse) const = 0;
  // MLA: rows of kvb [rows, k_dim + v_dim] split into k [rows, k_dim] and v [rows, v_dim].
  virtual void split_rows(const float* kvb, int64_t rows, int64_t k_dim, int64_t v_dim, float* k, float* v) const = 0;
  // Writes each new token's K/V rows (k [T, kv_heads, k_dim], v [T, kv_heads, v_dim]) into its
  // page slot, converted to the cache's dtype.
  virtual void kv_write(const float* k, const float* v, const SeqRange* seqs, int64_t num_seqs, const KvPages& kv,
                        int64_t kv_heads, int64_t k_dim, int64_t v_dim) const = 0;
  // Causal attention of each sequence's new tokens over its positions [0, context_len + j]:
  // K/V from the pages when kv is given, else from k/v rows of the batch itself. lse (may be
  // null) receives [T, heads] log-sum-exp of the scaled scores, which the backward needs.
  virtual void attention(const float* q, const float* k, const float* v, const KvPages* kv, const SeqRange* seqs,
                         int64_t num_seqs, const AttnDims& d, float* out, float* lse) const = 0;
  // y = sigmoid(x) (may alias).
  virtual void sigmoid(const float* x, int64_t n, float* y) const = 0;
  // out = a ∘ b (out may alias a or b).
  virtual void mul(const float* a, const float* b, int64_t n, float* out) const = 0;
  // out = silu(gate) ∘ up (out may alias gate or up).
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) const = 0;
  // Training dropout with the mask of backend/dropout_mask.h: y = x ∘ keep(seed, i) / (1 − p)
  // (y may alias x). Linear in x, so the backward is the same call on the gradient.
  virtual void dropout(const float* x, int64_t n, float p, uint64_t seed, float* y) const = 0;

  // ---- inference: sampling on the device ----
  // out[i] (host) = the token specs[i] (host) draws from row specs[i].row of logits [rows,
  // vocab] (this backend's memory), with its logprobs: backend/sample_rows.h, the engine's
  // sampler's arithmetic for rows without logit bias or penalties.
  virtual void sample(const float* logits, int64_t rows, int64_t vocab, const SampleSpec* specs, int64_t n,
                      SampleResult* out) const = 0;

  // ---- backward (training: f32 gradients; weights f32, or bf16/f16 when frozen: CPU only) ----
  // dx (+)= dy · W; dw += dy^T · x; db += Σ_rows dy (dw and db may be null: frozen weights;
  // they must be for a bf16/f16 W).
  virtual void linear_backward(const float* dy, const float* x, int64_t m, const Weight& w, float* dx,
                               bool accumulate_dx, float* dw, float* db) const = 0;
  virtual void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows,
                                int64_t dim, float* dx, bool accumulate_dx, float* dw) const = 0;
  // Of swiglu: da, db from dh and the forward's inputs a (gate) and b (up).
  virtual void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da,
                               float* db) const = 0;
  // Of y = att ∘ g, g = sigmoid(z): d_att = dy ∘ g, d_z = dy ∘ att ∘ g(1 − g). d_z may alias dy.
  virtual void gate_backward(const float* dy, const float* att, const float* g, int64_t n, float* d_att,
                             float* d_z) const = 0;
  // Of split_rows: dk and dv back into rows of d_kvb.
  virtual void join_rows(const float* dk, const float* dv, int64_t rows, int64_t k_dim, int64_t v_dim,
                         float* d_kvb) const = 0;
  // Of attention without a cache; dq, dk, dv are overwritten.
  virtual void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, const SeqRange* seqs, int64_t num_seqs,
                                  const AttnDims& d, float* dq, float* dk, float* dv) const = 0;
  // d_table[ids[i], :] += dx[i, :], in row order (deterministic).
  virtual void embedding_backward(const float* dx, const int32_t* ids, int64_t n, int64_t dim,
                                  float* d_table) const = 0;
  virtual void copy(const float* src, int64_t n, float* dst) const = 0;

  // ---- training: the loss, the gradient norm and the optimizer ----
  // x[0, n) = 0.
  virtual void zero(float* x, size_t n) const = 0;
  // Cross-entropy with label smoothing over logits [rows, vocab] and host targets (< 0:
  // ignored), as kernels/cpu/cross_entropy_backward.h defines it: row_loss [rows] receives
  // each row's loss, dlogits (null: none; may alias logits) the gradient of
  // grad_scale · Σ row_loss. Returns Σ row_loss in row order, in double.
  virtual double cross_entropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                               float label_smoothing, float grad_scale, float* row_loss, float* dlogits) const = 0;
  // out[b] (host) = Σ x[i]² in double over ranges[b] (host: [begin, end) in floats), for b
  // in [0, count).
  virtual void sum_squares(const FloatRange* ranges, size_t count, const float* x, double* out) const = 0;
  // x[0, n) *= c.
  virtual void scale(float* x, size_t n, float c) const = 0;
  // One AdamW update of n parameters (train/optimizer.h) with their moments m and v:
  //   p *= decay; m = b1·m + (1 − b1)·g; v = b2·v + (1 − b2)·g²;
  //   p −= step_size · m / (sqrt(v) / bc2_sqrt + eps).
  virtual void adamw(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s) const = 0;
};

// The CPU backend: the kernel table of kernels/cpu (the instruction-set level chosen at start).
const Ops& cpu_ops();

// The backend for memory on `device`; an error saying what is missing when the program has no
// backend for it (the CUDA backend is a library of its own, backend/cuda) or the machine has no
// usable GPU.
const Ops& ops_for(Device device);

// How a device backend makes itself known to ops_for (backend/cuda registers when linked in).
using OpsFactory = const Ops& (*)();
void register_backend(Device device, OpsFactory factory);

}  // namespace astrai::backend
