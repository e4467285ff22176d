// cuBLASLt for the CUDA backend's products of many rows with 16-bit weights: y[m, n] = x[m, k] ·
// W[n, k]^T (+ bias), W and the rounded x in bf16 or f16, f32 accumulation and output, the bias
// added by the matmul's epilogue (no kernel of its own). In cuBLAS's column-major terms: A = W
// (k x n, transposed), B = x (k x m), D = y (n x m), bias over D's n rows.
//
// A plan (descriptors and the heuristic's algorithm for the pointers' alignment) is made once
// per shape and kept (at most kMaxPlans; then the cache starts over). Any cuBLASLt failure (no
// algorithm for a shape, an error status) makes run() return false and the caller take its
// cublasGemmEx path; the first one is logged.
//
// Not yet run on a GPU (no session had one since it was written): CudaOps uses it only with
// ASTRAI_CUDA_LT=1, and scripts/gpu-check.sh runs the op and forward tests with it on and off.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "base/log.h"

namespace astrai::backend::cuda {

// Not thread-safe: CudaOps calls it under its mutex.
class LtGemm {
 public:
  // workspace: device memory of `bytes` for the algorithms, kept by the caller.
  LtGemm(void* workspace, size_t bytes) : workspace_(workspace), bytes_(bytes) {
    ok_ = cublasLtCreate(&handle_) == CUBLAS_STATUS_SUCCESS;
    if (!ok_) warn_once("cublasLtCreate failed");
  }
  ~LtGemm() {
    for (auto& [key, plan] : plans_) destroy(plan);
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // t: CUDA_R_16BF or CUDA_R_16F. Returns false (nothing issued) when cuBLASLt cannot do it.
  bool run(cudaDataType_t t, int n, int m, int k, const void* w, const void* x, const float* bias, float* y,
           cudaStream_t stream) {
    if (!ok_) return false;
    const Key key{static_cast<int>(t), n, m, k, bias != nullptr, alignment(w), alignment(x), alignment(y)};
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      if (plans_.size() >= kMaxPlans) {
        for (auto& [old, plan] : plans_) destroy(plan);
        plans_.clear();
      }
      Plan plan;
      if (!make_plan(key, &plan)) {
        destroy(plan);
        return false;
      }
      it = plans_.emplace(key, plan).first;
    }
    Plan& p = it->second;
    if (bias != nullptr &&
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)) !=
            CUBLAS_STATUS_SUCCESS)
      return fail("setting the bias pointer");
    const float one = 1.0f, zero = 0.0f;
    if (cublasLtMatmul(handle_, p.op, &one, w, p.a, x, p.b, &zero, y, p.d, y, p.d, &p.algo, workspace_, bytes_,
                       stream) != CUBLAS_STATUS_SUCCESS)
      return fail("cublasLtMatmul");
    return true;
  }

 private:
  // type, n, m, k, bias, and the alignments of W, x and y (the algorithm depends on them).
  using Key = std::tuple<int, int, int, int, bool, int, int, int>;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  static constexpr size_t kMaxPlans = 512;

  static int alignment(const void* p) {
    const auto v = reinterpret_cast<uintptr_t>(p);
    int a = 1;
    while (a < 256 && v % (2 * a) == 0) a *= 2;
    return a;
  }

  bool make_plan(const Key& key, Plan* p) {
    const auto [type, n, m, k, bias, align_w, align_x, align_y] = key;
    const auto t = static_cast<cudaDataType_t>(type);
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const cudaDataType_t bias_type = CUDA_R_32F;
    if (cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)) !=
            CUBLAS_STATUS_SUCCESS)
      return fail("the matmul descriptor");
    if (bias && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                               sizeof(bias_type)) != CUBLAS_STATUS_SUCCESS)
      return fail("the bias type");
    if (cublasLtMatrixLayoutCreate(&p->a, t, k, n, k) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&p->b, t, k, m, k) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, n, m, n) != CUBLAS_STATUS_SUCCESS)
      return fail("the matrix layouts");
    cublasLtMatmulPreference_t pref = nullptr;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return fail("the preference");
    const uint32_t aw = static_cast<uint32_t>(align_w), ax = static_cast<uint32_t>(align_x),
                   ay = static_cast<uint32_t>(align_y);
    const size_t ws = bytes_;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const bool set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                          sizeof(ws)) == CUBLAS_STATUS_SUCCESS &&
                     cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw,
                                                          sizeof(aw)) == CUBLAS_STATUS_SUCCESS &&
                     cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax,
                                                          sizeof(ax)) == CUBLAS_STATUS_SUCCESS &&
                     cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay,
                                                          sizeof(ay)) == CUBLAS_STATUS_SUCCESS &&
                     cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay,
                                                          sizeof(ay)) == CUBLAS_STATUS_SUCCESS;
    const bool heuristic = set && cublasLtMatmulAlgoGetHeuristic(handle_, p->op, p->a, p->b, p->d, p->d, pref, 1,
                                                                 &result, &found) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreferenceDestroy(pref);
    if (!heuristic || found == 0) return fail("no algorithm for the shape");
    p->algo = result.algo;
    return true;
  }

  static void destroy(Plan& p) {
    if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d != nullptr) cublasLtMatrixLayoutDestroy(p.d);
    if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
    p = Plan{};
  }

  bool fail(const char* what) {
    warn_once(what);
    return false;
  }
  void warn_once(const char* what) {
    if (!warned_) log_warn("cuBLASLt: ", what, "; products of 16-bit weights go through cublasGemmEx instead");
    warned_ = true;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t bytes_;
  bool ok_ = false;
  bool warned_ = false;
  std::map<Key, Plan> plans_;
};

}  // namespace astrai::backend::cuda
