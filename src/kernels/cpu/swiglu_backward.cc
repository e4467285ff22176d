#include "kernels/cpu/swiglu_backward.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/level_table.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

namespace {
constexpr int64_t kChunk = 4096;  // elements per parallel work item (a multiple of 16)

// fn(i, n) for the 16-lane steps [i, i + n) of [0, total), n <= 16, over fixed chunks.
template <typename Fn>
void for_each_step(int64_t total, Fn&& fn) {
  const int64_t chunks = (total + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(total, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; i += kLanes) fn(i, end - i);
  }
}
}  // namespace

void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da, float* db) {
  const Vec16 one(1.0f);
  for_each_step(n, [&](int64_t i, int64_t k) {
    const Vec16 av = vload_n(a + i, k), bv = vload_n(b + i, k), g = vload_n(dh + i, k);
    const Vec16 sg = sigmoid(av);
    // da = g * b * sg * (1 + a * (1 - sg)), db = g * a * sg
    const Vec16 t = vfma(av, one - sg, one);
    vstore_n(da + i, g * bv * sg * t, k);
    vstore_n(db + i, g * (av * sg), k);
  });
}

void sigmoid_forward(const float* x, int64_t n, float* g) {
  for_each_step(n, [&](int64_t i, int64_t k) { vstore_n(g + i, sigmoid(vload_n(x + i, k)), k); });
}

void fill_swiglu_backward(KernelTable& t) {
  t.swiglu_backward = &swiglu_backward;
  t.sigmoid_forward = &sigmoid_forward;
}

ASTRAI_KERNELS_END
