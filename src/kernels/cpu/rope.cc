#include "kernels/cpu/rope.h"

#include <cmath>

#include "kernels/cpu/level_table.h"

ASTRAI_KERNELS_BEGIN

void rope_sincos(const double* inv_freq, int64_t half, const int32_t* positions, int64_t n, bool f32_angle,
                 float* cos, float* sin) {
#pragma omp parallel for schedule(static) if (n * half > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t f = 0; f < half; ++f) {
      double a;
      if (f32_angle) {
        a = static_cast<double>(static_cast<float>(positions[i]) * static_cast<float>(inv_freq[f]));
      } else {
        a = static_cast<double>(positions[i]) * inv_freq[f];
      }
      cos[i * half + f] = static_cast<float>(std::cos(a));
      sin[i * half + f] = static_cast<float>(std::sin(a));
    }
  }
}

void rope_rotate(float* x, int64_t tokens, int64_t heads, int64_t head_stride, int64_t rot_offset, int64_t half,
                 const float* cos, const float* sin, RopePairing pairing, bool inverse) {
  const bool adjacent = pairing == RopePairing::kAdjacent;
#pragma omp parallel for schedule(static) if (tokens * heads * half > (1 << 15))
  for (int64_t i = 0; i < tokens; ++i) {
    const float* c = cos + i * half;
    const float* s = sin + i * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (i * heads + h) * head_stride + rot_offset;
      if (adjacent) {
        for (int64_t f = 0; f < half; ++f) {
          const float a = v[2 * f], b = v[2 * f + 1], sf = inverse ? -s[f] : s[f];
          v[2 * f] = a * c[f] - b * sf;
          v[2 * f + 1] = a * sf + b * c[f];
        }
      } else {
        float* lo = v;
        float* hi = v + half;
        for (int64_t f = 0; f < half; ++f) {
          const float a = lo[f], b = hi[f], sf = inverse ? -s[f] : s[f];
          lo[f] = a * c[f] - b * sf;
          hi[f] = b * c[f] + a * sf;
        }
      }
    }
  }
}

void fill_rope(KernelTable& t) {
  t.rope_sincos = &rope_sincos;
  t.rope_rotate = &rope_rotate;
}

ASTRAI_KERNELS_END
