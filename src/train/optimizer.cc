#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace astrai::train {

AdamW::AdamW(const ParamLayout& layout, AdamWConfig config, const backend::Ops& ops)
    : AdamW(layout.specs(), layout.total(), 0, layout.total(), config, ops) {}

AdamW::AdamW(const std::vector<ParamSpec>& specs, size_t total, AdamWConfig config)
    : AdamW(specs, total, 0, total, config) {}

AdamW::AdamW(const std::vector<ParamSpec>& specs, size_t total, size_t shard_begin, size_t shard_end,
             AdamWConfig config, const backend::Ops& ops)
    : config_(config), shard_begin_(shard_begin), shard_end_(shard_end), m_(shard_end - shard_begin, ops),
      v_(shard_end - shard_begin, ops) {
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
  backend::AdamWStep s;
  s.beta1 = config_.beta1;
  s.beta2 = config_.beta2;
  s.eps = config_.eps;
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(step_));
  s.step_size = static_cast<float>(lr / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  // m[i - shard_begin_] is the moment of params[i].
  for (const Range& r : ranges_) {
    s.decay = r.decay ? 1.0f - lr * config_.weight_decay : 1.0f;
    const size_t j = r.begin - shard_begin_;
    m_.ops().adamw(params + r.begin, grads + r.begin, m_.data() + j, v_.data() + j, r.end - r.begin, s);
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
