#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace astrai::train {

AdamW::AdamW(const ParamLayout& layout, AdamWConfig config) : AdamW(layout.specs(), layout.total(), config) {}

AdamW::AdamW(const std::vector<ParamSpec>& specs, size_t total, AdamWConfig config)
    : AdamW(specs, total, 0, total, config) {}

AdamW::AdamW(const std::vector<ParamSpec>& specs, size_t total, size_t shard_begin, size_t shard_end,
             AdamWConfig config)
    : config_(config), shard_begin_(shard_begin), shard_end_(shard_end), m_(shard_end - shard_begin),
      v_(shard_end - shard_begin) {
  ASTRAI_CHECK(shard_begin <= shard_end && shard_end <= total, "AdamW: shard [", shard_begin, ", ", shard_end,
               ") outside the buffer of ", total, " floats");
  for (const auto& s : specs) {
    bool decay = s.kind == model::ParamKind::kMatrix;
    if (s.kind == model::ParamKind::kEmbedding) decay = config.decay_embeddings;
    else if (!decay) decay = config.decay_norms_and_biases;
    const size_t b = std::max(s.offset, shard_begin), e = std::min(s.offset + s.numel, shard_end);
    if (b < e) ranges_.push_back({b, e, decay});
  }
}

void AdamW::step(float* params, const float* grads, float lr) {
  ++step_;
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  float* m = m_.data();  // m[i - shard_begin_]: the moment of params[i]
  float* v = v_.data();
  const size_t sb = shard_begin_;
  for (const Range& r : ranges_) {
    const float decay = r.decay ? 1.0f - lr * config_.weight_decay : 1.0f;
#pragma omp parallel for simd schedule(static)
    for (size_t i = r.begin; i < r.end; ++i) {
      const float g = grads[i];
      params[i] *= decay;
      const size_t j = i - sb;
      m[j] = b1 * m[j] + (1.0f - b1) * g;
      v[j] = b2 * v[j] + (1.0f - b2) * g * g;
      const float denom = std::sqrt(v[j]) / bc2_sqrt + eps;
      params[i] -= step_size * (m[j] / denom);
    }
  }
}

double clip_grad_norm(float* grads, size_t n, double max_norm) {
  // Fixed-size blocks summed in order: the same result for any thread count.
  const size_t block = 1 << 16;
  const size_t nb = (n + block - 1) / block;
  std::vector<double> part(nb, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < nb; ++b) {
    double s = 0.0;
    const size_t end = std::min(n, (b + 1) * block);
    for (size_t i = b * block; i < end; ++i) s += static_cast<double>(grads[i]) * grads[i];
    part[b] = s;
  }
  double total = 0.0;
  for (double s : part) total += s;
  const double norm = std::sqrt(total);
  if (max_norm > 0.0 && std::isfinite(norm)) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < n; ++i) grads[i] *= c;
    }
  }
  return norm;
}

}  // namespace astrai::train
