// The dropout mask of training (LoRA's adapter input): element i is kept when a hash of
// (seed, i) falls at or above p, so the mask is a pure function of the seed. The forward and
// the backward apply the same mask without storing it, every backend draws the same one, and
// the PyTorch oracle (tests/train/oracle_train.py) recomputes it.
//   u = splitmix64(seed + i);  keep = (u >> 40) · 2^-24 >= p;  y = keep ? x · (1 / (1 − p)) : 0
#pragma once

#include <cstdint>

#include "base/host_device.h"

namespace astrai::backend {

ASTRAI_HOST_DEVICE inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

ASTRAI_HOST_DEVICE inline bool dropout_keep(uint64_t seed, int64_t i, float p) {
  const float u = static_cast<float>(splitmix64(seed + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
  return u >= p;
}

}  // namespace astrai::backend
