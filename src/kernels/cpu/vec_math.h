// Small math shared by the kernels of a level, written once over Vec16 (simd.h) so every level
// performs the same operations: exp_approx, dot, sum, max.
#pragma once

#include <cmath>
#include <cstdint>

#include "base/host_device.h"
#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

ASTRAI_KERNELS_BEGIN

// exp(x) for float or Vec16 (kernels/exp_approx.inc, in this level's namespace).
#include "kernels/exp_approx.inc"

// 1 / (1 + exp(-x)).
template <typename V>
inline V sigmoid(V x) {
  const V one(1.0f);
  return one / (one + exp_approx(V(0.0f) - x));
}

// Sum of a[i] * b[i] in the contract's order: 16 lane partial sums, lane l accumulating the
// i = l, l + 16, ... in increasing i by fused multiply-adds (the tail zero-padded), then the
// fixed tree. b is f32 or bf16 (uint16_t).
template <typename B>
inline float dot(const float* a, const B* b, int64_t n) {
  Vec16 acc = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc = vfma(vload(a + i), vload_elem(b + i), acc);
  if (i < n) acc = vfma(vload(a + i, n - i), vload_elem(b + i, n - i), acc);
  return vsum(acc);
}

inline float sum_squares(const float* a, int64_t n) { return dot(a, a, n); }

// Plain sum, 16 lane partial sums then the tree.
inline float sum(const float* a, int64_t n) {
  Vec16 acc = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc = acc + vload(a + i);
  if (i < n) acc = acc + vload(a + i, n - i);
  return vsum(acc);
}

// max of a[0, n), n >= 1, in lanes then the tree (vmax semantics).
inline float max_value(const float* a, int64_t n) {
  Vec16 m(-INFINITY);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) m = vmax(m, vload(a + i));
  if (i < n) m = vmax(m, vload_or(a + i, n - i, m));
  return vmaxlanes(m);
}

// y[i] = a * exp(x[i] - shift) + b (one fused multiply-add); y may alias x.
inline void exp_affine(const float* x, float shift, float a, float b, int64_t n, float* y) {
  const Vec16 s(shift), av(a), bv(b);
  for (int64_t i = 0; i < n; i += kLanes) vstore_n(y + i, vfma(av, exp_approx(vload_n(x + i, n - i) - s), bv), n - i);
}

ASTRAI_KERNELS_END
