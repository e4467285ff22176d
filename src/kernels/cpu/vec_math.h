// Small inline math shared by the CPU kernels, written as plain fixed-width lane loops so
// the compiler vectorises them without -ffast-math and the reduction order is fixed at
// compile time (never dependent on pointer alignment or on the batch).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"

namespace astrai::kernels {

constexpr int kLanes = 16;

// exp(x) for float, max relative error ~2 ulp on [-87, 88]; below -87 returns 0 (softmax
// and sigmoid only need that). Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6
// polynomial for e^r, 2^n assembled in the exponent bits.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;  // ln2 split in two for an exact first step
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// y[i] = exp(x[i] - shift) for n values; returns nothing (vectorised).
inline void exp_shifted(const float* x, float shift, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp_approx(x[i] - shift);
}

// An element of an f32 or bf16 (stored as uint16_t) row as f32; bf16 widens exactly.
inline float widen(float x) { return x; }
inline float widen(uint16_t bf16) { return bf16_to_f32(bf16); }

// Sum of a[i] * b[i] in a fixed order: 16 lane accumulators over i = l, l + 16, ..., then
// the lanes added pairwise (8, 4, 2, 1). The same n always gives the same order. b is f32 or
// bf16 (uint16_t).
template <typename B>
inline float dot(const float* a, const B* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * widen(b[i + l]);
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * widen(b[i + l]);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// Sum of squares with dot()'s order.
inline float sum_squares(const float* a, int64_t n) { return dot(a, a, n); }

// Plain sum with dot()'s order.
inline float sum(const float* a, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l];
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

inline float max_value(const float* a, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

}  // namespace astrai::kernels
