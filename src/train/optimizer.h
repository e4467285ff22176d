// AdamW with decoupled weight decay (PyTorch torch.optim.AdamW semantics, f32), over the
// flat parameter/gradient arrays of a ParamLayout. Norm weights, biases and embeddings are
// not decayed unless asked.
#pragma once

#include <cstdint>
#include <vector>

#include "base/json.h"
#include "train/params.h"

namespace astrai::train {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  bool decay_norms_and_biases = false;
  bool decay_embeddings = false;
};

class AdamW {
 public:
  AdamW(const ParamLayout& layout, AdamWConfig config);
  // Over any parameters laid out by `specs` in a buffer of `total` floats (LoRA factors).
  AdamW(const std::vector<ParamSpec>& specs, size_t total, AdamWConfig config);
  // One update with learning rate lr; increments step().
  void step(float* params, const float* grads, float lr);
  int64_t step_count() const { return step_; }
  const AdamWConfig& config() const { return config_; }
  // Moments for checkpoints.
  FloatBuffer& m() { return m_; }
  FloatBuffer& v() { return v_; }
  void set_step_count(int64_t s) { step_ = s; }

 private:
  struct Range {
    size_t begin, end;
    bool decay;
  };
  AdamWConfig config_;
  std::vector<Range> ranges_;
  FloatBuffer m_, v_;
  int64_t step_ = 0;
};

// Global L2 norm of all gradients (in double, fixed order); when max_norm > 0 and the norm
// exceeds it, scales every gradient by max_norm / (norm + 1e-6) as
// torch.nn.utils.clip_grad_norm_ does. Returns the norm before clipping.
double clip_grad_norm(float* grads, size_t n, double max_norm);

}  // namespace astrai::train
