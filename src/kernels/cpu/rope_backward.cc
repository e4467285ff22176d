#include "kernels/cpu/rope_backward.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace astrai::kernels {

std::vector<float> rope_inv_freq(int64_t rot_dim, double theta, const RopeScaling& s,
                                 float* attention_scale) {
  const int64_t half = rot_dim / 2;
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    // HF: 1 / base ** (arange(0, dim, 2).float() / dim), in f32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    inv[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(expo)));
  }
  *attention_scale = 1.0f;
  if (s.type.empty() || s.type == "default") return inv;
  if (s.type == "linear") {
    for (auto& f : inv) f = static_cast<float>(f / s.factor);
  } else if (s.type == "llama3") {
    const double low_wavelen = s.original_max_position / s.low_freq_factor;
    const double high_wavelen = s.original_max_position / s.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / s.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / s.factor + smooth * f);
      }
    }
  } else if (s.type == "yarn") {
    auto correction_dim = [&](double rotations) {
      return (rot_dim * std::log(s.original_max_position / (rotations * 2 * std::numbers::pi))) /
             (2 * std::log(theta));
    };
    const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
    const double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(rot_dim - 1));
    for (int64_t i = 0; i < half; ++i) {
      const double hi = (high == low) ? high + 0.001 : high;
      const double ramp = std::clamp((static_cast<double>(i) - low) / (hi - low), 0.0, 1.0);
      const double extrapolation_factor = 1.0 - ramp;
      const double pos_freq = 1.0 / inv[i];
      const double interp = 1.0 / (s.factor * pos_freq);
      const double extrap = 1.0 / pos_freq;
      inv[i] = static_cast<float>(interp * (1.0 - extrapolation_factor) + extrap * extrapolation_factor);
    }
    *attention_scale = static_cast<float>(
        s.attention_factor > 0 ? s.attention_factor
                               : (s.factor <= 1 ? 1.0 : 0.1 * std::log(s.factor) + 1.0));
  } else {
    // Validated by the config parser; unknown types never get here.
  }
  return inv;
}

void RopeTable::build(const std::vector<float>& inv_freq, float attention_scale, int32_t max_position) {
  half = static_cast<int64_t>(inv_freq.size());
  const size_t n = static_cast<size_t>(max_position + 1) * half;
  if (cos.size() >= n) return;
  cos.resize(n);
  sin.resize(n);
  for (int32_t p = 0; p <= max_position; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      cos[p * half + i] = std::cos(angle) * attention_scale;
      sin[p * half + i] = std::sin(angle) * attention_scale;
    }
  }
}

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

}  // namespace astrai::kernels
