// Small math shared by the kernels of a level, written once over Vec16 (simd.h) so every level
// performs the same operations: exp_approx, dot, sum, max.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

ASTRAI_KERNELS_BEGIN

// exp(x) for float or Vec16, max relative error ~2 ulp on [-87, 88]; x is clamped to that range
// first (below -87 gives ~1e-38: softmax and sigmoid only need that). Cephes-style: x = n ln2 + r,
// |r| <= ln2/2, a degree-6 polynomial for e^r, 2^n assembled in the exponent bits.
template <typename V>
inline V exp_approx(V x) {
  x = vmax(vmin(x, V(88.0f)), V(-87.0f));
  const V n = vfloor(vfma(x, V(1.44269504088896341f), V(0.5f)));
  V r = vfnma(n, V(0.693359375f), x);  // ln2 split in two for an exact first step
  r = vfnma(n, V(-2.12194440e-4f), r);
  V p = V(1.9875691500e-4f);
  p = vfma(p, r, V(1.3981999507e-3f));
  p = vfma(p, r, V(8.3334519073e-3f));
  p = vfma(p, r, V(4.1665795894e-2f));
  p = vfma(p, r, V(1.6666665459e-1f));
  p = vfma(p, r, V(5.0000001201e-1f));
  p = vfma(p * r, r, r + V(1.0f));
  return p * vpow2i(n);
}

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
