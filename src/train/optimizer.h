// AdamW with decoupled weight decay (PyTorch torch.optim.AdamW semantics, f32), over the
// flat parameter/gradient arrays of a ParamLayout. Norm weights, biases and embeddings are
// not decayed unless asked. The moments live in the memory of the backend given (host memory
// by default), with the parameters and gradients; the update is that backend's `adamw`.
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
  AdamW(const ParamLayout& layout, AdamWConfig config, const backend::Ops& ops = backend::cpu_ops());
  // Over any parameters laid out by `specs` in a buffer of `total` floats (LoRA factors).
  AdamW(const std::vector<ParamSpec>& specs, size_t total, AdamWConfig config);
  // ZeRO-1: moments (and updates) for the floats [shard_begin, shard_end) of that buffer only
  // (train/shards.h); m() and v() then hold shard_end - shard_begin floats, m()[0] being the
  // moment of float shard_begin.
  AdamW(const std::vector<ParamSpec>& specs, size_t total, size_t shard_begin, size_t shard_end, AdamWConfig config,
        const backend::Ops& ops = backend::cpu_ops());
  // One update with learning rate lr of the owned floats of params (whole buffers, indexed
  // like the layout); increments step().
  void step(float* params, const float* grads, float lr);
  size_t shard_begin() const { return shard_begin_; }
  size_t shard_end() const { return shard_end_; }
  // Bytes of the moments this optimizer holds (m and v).
  int64_t state_bytes() const { return static_cast<int64_t>((m_.size() + v_.size()) * sizeof(float)); }
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
  size_t shard_begin_ = 0, shard_end_ = 0;
  std::vector<Range> ranges_;  // the parameters' ranges clipped to the shard
  FloatBuffer m_, v_;
  int64_t step_ = 0;
};

// Global L2 norm of all gradients (host memory; in double, fixed order); when max_norm > 0 and the norm
// exceeds it, scales every gradient by max_norm / (norm + 1e-6) as
// torch.nn.utils.clip_grad_norm_ does. Returns the norm before clipping.
double clip_grad_norm(float* grads, size_t n, double max_norm);

}  // namespace astrai::train
