#include "kernels/cpu/rope_backward.h"

#include "kernels/cpu/level_table.h"

ASTRAI_KERNELS_BEGIN

void rope_apply(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                int64_t head_dim, int64_t rot_dim, RopePairing pairing, const RopeTable& table,
                bool inverse) {
  const int64_t half = rot_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = table.cos.data() + static_cast<int64_t>(positions[t]) * table.half;
    const float* s = table.sin.data() + static_cast<int64_t>(positions[t]) * table.half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = pairing == RopePairing::kHalf ? i : 2 * i;
        const int64_t b = pairing == RopePairing::kHalf ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        const float si = sign * s[i];
        v[a] = x0 * c[i] - x1 * si;
        v[b] = x1 * c[i] + x0 * si;
      }
    }
  }
}

void fill_rope_backward(KernelTable& t) { t.rope_apply = &rope_apply; }

ASTRAI_KERNELS_END
