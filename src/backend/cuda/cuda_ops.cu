// The CUDA backend: backend::Ops over device memory, one class (CudaOps) over the kernels of
// kernels.cuh and attention.cuh. Products of few rows (decode) go through the backend's gemv,
// larger ones through cuBLAS (f32 SGEMM, or GemmEx with the activations rounded to the
// weights' 16-bit type and f32 accumulation; with ASTRAI_CUDA_LT=1 the 16-bit ones through
// cuBLASLt with the bias in its epilogue, lt_gemm.h); every other operation is one plain kernel
// (train_kernels.cuh: the loss, the gradient norm and AdamW of a training step).
//
// All work goes to one stream of the backend's. Index arrays arrive in host memory (ops.h);
// each operation copies what it needs through a pinned staging buffer into device arrays that
// grow and are reused (staging.h). Decode steps can be recorded as CUDA graphs and replayed
// (run_cached): a replay redoes only the host side of each operation, whose uploads land where
// the graph copies them from (Mode::kPrepare).
#include "backend/cuda/cuda_ops.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/lt_gemm.h"
#include "backend/cuda/sampling.cuh"
#include "backend/cuda/staging.h"
#include "backend/cuda/train_kernels.cuh"
#include "base/error.h"
#include "base/log.h"

namespace astrai::backend::cuda {

namespace {

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
    // cuBLASLt for the 16-bit products of many rows: opt-in until it has run on a GPU (lt_gemm.h).
    const char* lt = std::getenv("ASTRAI_CUDA_LT");
    if (lt != nullptr && std::string(lt) == "1") lt_ = std::make_unique<LtGemm>(blas_workspace_, kBlasWorkspace);
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
    const int32_t* d_ids = upload(ids_, ids, n);
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
    const int32_t* d_rows = upload(rows_, rows, n);
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
      if (lt_ != nullptr && lt_->run(t, n, mm, k, w.data, xh, bias, y, stream_)) return;  // bias in its epilogue
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
    host_pos_.assign(static_cast<size_t>(rows), DocPos{0, -1, 0});
    for (int64_t s = 0; s < num_seqs; ++s)
      for (int32_t j = 0; j < seqs[s].num_tokens; ++j)
        host_pos_[static_cast<size_t>(seqs[s].token_begin + j)] = DocPos{seqs[s].token_begin, j, seqs[s].num_tokens};
    const DocPos* d_pos = upload(doc_pos_, host_pos_);
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
    const int32_t* d_ids = upload(ids_, ids, n);
    embedding_backward_kernel<<<blocks_for(dim), kThreads, 0, stream_>>>(dx, d_ids, n, dim, d_table);
    check_launch("embedding backward");
  }

  void copy(const float* src, int64_t n, float* dst) const override {
    if (src == dst || n == 0 || preparing()) return;
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
               "copy");
  }

  // ---- training: the loss, the gradient norm and the optimizer (kRun only) ----
  void zero(float* x, size_t n) const override {
    if (n == 0) return;
    check_cuda(cudaMemsetAsync(x, 0, n * sizeof(float), stream_), "zero");
  }

  // The rows' losses come back to the host and are summed there in row order (as the CPU does).
  double cross_entropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float label_smoothing,
                       float grad_scale, float* row_loss, float* dlogits) const override {
    if (rows == 0) return 0.0;
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t* d_targets = upload(targets_, targets, rows);
    cross_entropy_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream_>>>(logits, d_targets, vocab,
                                                                               label_smoothing, grad_scale, row_loss,
                                                                               dlogits);
    check_launch("cross_entropy");
    host_loss_.resize(static_cast<size_t>(rows));
    check_cuda(cudaMemcpyAsync(host_loss_.data(), row_loss, host_loss_.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               stream_),
               "cross_entropy: the rows' losses");
    check_cuda(cudaStreamSynchronize(stream_), "cross_entropy");
    double total = 0.0;
    for (float l : host_loss_) total += l;
    return total;
  }

  // A block per spec, kSampleRowsPerLaunch specs per launch; the results come back at the end.
  void sample(const float* logits, int64_t rows, int64_t vocab, const SampleSpec* specs, int64_t n,
              SampleResult* out) const override {
    check_sample_specs(specs, n, rows);
    if (n == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t per_launch = std::min<int64_t>(n, kSampleRowsPerLaunch);
    const int64_t keys_per_row = sampling::pow2_at_least(vocab);
    const int64_t blocks_per_row = vocab / sampling::kDrawBlock + 1;
    const SampleSpec* d_specs = upload(sample_specs_, specs, n);
    float* w = scratch(sample_w_, static_cast<size_t>(per_launch * vocab));
    uint64_t* keys = scratch(sample_keys_, static_cast<size_t>(per_launch * keys_per_row));
    double* blocks = scratch(sample_blocks_, static_cast<size_t>(per_launch * blocks_per_row));
    SampleResult* d_out = scratch(sample_out_, static_cast<size_t>(n));
    for (int64_t first = 0; first < n; first += per_launch) {
      const int64_t count = std::min(per_launch, n - first);
      sample_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream_>>>(
          logits, vocab, d_specs + first, w, keys, keys_per_row, blocks, blocks_per_row, d_out + first);
      check_launch("sample");
    }
    check_cuda(cudaMemcpyAsync(out, d_out, static_cast<size_t>(n) * sizeof(SampleResult), cudaMemcpyDeviceToHost,
                               stream_),
               "sample: the results");
    check_cuda(cudaStreamSynchronize(stream_), "sample");
  }

  void sum_squares(const FloatRange* ranges, size_t count, const float* x, double* out) const override {
    if (count == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const FloatRange* d_ranges = upload(ranges_, ranges, static_cast<int64_t>(count));
    double* d_out = scratch(sums_, count);
    sum_squares_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream_>>>(d_ranges, x, d_out);
    check_launch("sum_squares");
    check_cuda(cudaMemcpyAsync(out, d_out, count * sizeof(double), cudaMemcpyDeviceToHost, stream_),
               "sum_squares: the sums");
    check_cuda(cudaStreamSynchronize(stream_), "sum_squares");
  }

  void scale(float* x, size_t n, float c) const override {
    if (n == 0) return;
    scale_kernel<<<blocks_for(static_cast<int64_t>(n)), kThreads, 0, stream_>>>(x, n, c);
    check_launch("scale");
  }

  void adamw(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s) const override {
    if (n == 0) return;
    adamw_kernel<<<blocks_for(static_cast<int64_t>(n)), kThreads, 0, stream_>>>(p, g, m, v, n, s);
    check_launch("adamw");
  }

 private:
  // Backward operations and the copies run in kRun only (training never caches its steps).
  bool preparing() const { return mode_ == Mode::kPrepare; }

  template <typename T>
  const T* upload(DeviceArray<T>& array, const T* host, int64_t count) const {
    return array.upload(host, static_cast<size_t>(count), stager_, mode_, stream_);
  }
  template <typename T>
  const T* upload(DeviceArray<T>& array, const std::vector<T>& host) const {
    return upload(array, host.data(), static_cast<int64_t>(host.size()));
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
    targets_.forget();
    ranges_.forget();
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
  mutable std::unique_ptr<LtGemm> lt_;  // null unless ASTRAI_CUDA_LT=1
  int sm_count_ = 1;
  int gemv_rows_16bit_ = kGemvRows16Bit;
  mutable std::mutex mu_;  // guards the scratch below
  mutable Mode mode_ = Mode::kRun;
  mutable Stager stager_;
  // One array per kind of index, so each keeps the step's values across the layers.
  mutable DeviceArray<int32_t> ids_, rows_, page_tables_, slots_;
  mutable DeviceArray<QueryDesc> queries_;
  mutable DeviceArray<DocPos> doc_pos_;
  mutable DeviceArray<int32_t> targets_;
  mutable DeviceArray<FloatRange> ranges_;
  mutable DeviceArray<double> sums_;
  mutable DeviceArray<SampleSpec> sample_specs_;
  mutable DeviceArray<float> sample_w_;
  mutable DeviceArray<uint64_t> sample_keys_;
  mutable DeviceArray<double> sample_blocks_;
  mutable DeviceArray<SampleResult> sample_out_;
  mutable DeviceArray<float> row_dot_, partial_;
  mutable DeviceArray<uint16_t> half_x_;
  mutable std::vector<float> host_cos_, host_sin_;
  mutable std::vector<int32_t> host_slots_, host_tables_;
  mutable std::vector<QueryDesc> host_queries_;
  mutable std::vector<DocPos> host_pos_;
  mutable std::vector<float> host_loss_;
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

