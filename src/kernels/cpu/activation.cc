#include "kernels/cpu/activation.h"

#include <cstdint>

#include "kernels/cpu/level_table.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

namespace {
constexpr int64_t kParallelMin = 1 << 16;
constexpr int64_t kChunk = 4096;  // elements per parallel work item (a multiple of 16)

// fn(i, n) for the 16-lane steps [i, i + n) of [0, total), n <= 16, over fixed chunks split
// between the threads when there are enough elements: each element's operations never depend
// on the thread count or on where a step starts.
template <typename Fn>
void for_each_step(int64_t total, Fn&& fn) {
  const int64_t chunks = (total + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = c * kChunk + kChunk < total ? c * kChunk + kChunk : total;
    for (int64_t i = c * kChunk; i < end; i += kLanes) fn(i, end - i);
  }
}

}  // namespace

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for_each_step(n, [&](int64_t i, int64_t k) {
    const Vec16 g = vload_n(gate + i, k);
    const Vec16 silu = g / (Vec16(1.0f) + exp_approx(Vec16(0.0f) - g));
    vstore_n(out + i, silu * vload_n(up + i, k), k);
  });
}

void mul_sigmoid(float* x, const float* g, int64_t n) {
  for_each_step(n, [&](int64_t i, int64_t k) { vstore_n(x + i, vload_n(x + i, k) * sigmoid(vload_n(g + i, k)), k); });
}

void add_inplace(float* y, const float* x, int64_t n) {
  for_each_step(n, [&](int64_t i, int64_t k) { vstore_n(y + i, vload_n(y + i, k) + vload_n(x + i, k), k); });
}

void fill_activation(KernelTable& t) {
  t.swiglu = &swiglu;
  t.mul_sigmoid = &mul_sigmoid;
  t.add_inplace = &add_inplace;
}

ASTRAI_KERNELS_END
