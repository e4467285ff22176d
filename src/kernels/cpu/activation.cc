#include "kernels/cpu/activation.h"

#include "kernels/cpu/vec_math.h"

namespace astrai::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 16;
constexpr int64_t kChunk = 4096;
}  // namespace

// Chunks of fixed size keep the per-element math identical whatever the thread count.
void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = c * kChunk + kChunk < n ? c * kChunk + kChunk : n;
    for (int64_t i = c * kChunk; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + exp_approx(-g)) * up[i];
    }
  }
}

void mul_sigmoid(float* x, const float* g, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = c * kChunk + kChunk < n ? c * kChunk + kChunk : n;
    for (int64_t i = c * kChunk; i < end; ++i) x[i] = x[i] * (1.0f / (1.0f + exp_approx(-g[i])));
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = c * kChunk + kChunk < n ? c * kChunk + kChunk : n;
    for (int64_t i = c * kChunk; i < end; ++i) y[i] += x[i];
  }
}

}  // namespace astrai::kernels
