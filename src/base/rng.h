// The one random generator of AstrAI (data order, sampling seeds, anything that must replay):
// splitmix64, a counter-based generator with one word of state. Unlike std:: distributions it
// gives the same stream on every platform, compiler and standard library.
#pragma once

#include <cstdint>

namespace astrai {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed = 0) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Uniform in [0, bound), unbiased (the top partial block is rejected), bound > 0.
  uint64_t below(uint64_t bound) {
    const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % bound);
    uint64_t x;
    do {
      x = next();
    } while (x >= limit);
    return x % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace astrai
