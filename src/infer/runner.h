// Packs a step into one model::Batch (reusing its buffers: no per-step allocation once warm),
// runs the single forward pass, and keeps the logits of the rows that need them.
#pragma once

#include <cstdint>
#include <vector>

#include "infer/backend.h"
#include "infer/scheduler.h"

namespace astrai::infer {

class Runner {
 public:
  explicit Runner(ForwardBackend& backend) : backend_(backend) {}

  // Runs the step. Items with on_device[i] set (a sampling item, not all_rows; on_device may be
  // empty: none) leave their row in the backend's memory, to be sampled there (sample); the
  // others' rows come to the host (logits). Without ForwardBackend::can_sample, every row does.
  void run(const std::vector<StepItem>& step, const KvStorage& kv, const std::vector<uint8_t>& on_device = {});
  // Logits of item i's first wanted row (its last row, or its first when all_rows); vocab floats
  // per row, consecutive for all_rows items. Not for items run on_device.
  float* logits(size_t item) { return logits_.data() + size_t(first_row_[item]) * vocab(); }
  // Index of item i's first wanted row among the step's logit rows (a SampleSpec's row).
  int64_t row(size_t item) const { return first_row_[item]; }
  // Tokens drawn by the backend from rows left on the device (ForwardBackend::sample).
  void sample(const backend::SampleSpec* specs, int64_t n, backend::SampleResult* out) const {
    backend_.sample(specs, n, out);
  }
  int32_t vocab() const { return backend_.info().vocab_size; }
  const model::Batch& batch() const { return batch_; }

 private:
  ForwardBackend& backend_;
  model::Batch batch_;
  std::vector<int32_t> first_row_;
  std::vector<float> logits_;
};

}  // namespace astrai::infer
