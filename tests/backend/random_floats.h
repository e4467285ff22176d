// Normal random floats for the backend tests (seeded: the same values every run).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace astrai::backend {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace astrai::backend
