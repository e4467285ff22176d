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

  void run(const std::vector<StepItem>& step, const KvStorage& kv);
  // Logits of item i's first wanted row (its last row, or its first when all_rows); vocab floats
  // per row, consecutive for all_rows items.
  float* logits(size_t item) { return logits_.data() + size_t(first_row_[item]) * vocab(); }
  int32_t vocab() const { return backend_.info().vocab_size; }
  const model::Batch& batch() const { return batch_; }

 private:
  ForwardBackend& backend_;
  model::Batch batch_;
  std::vector<int32_t> first_row_;
  std::vector<float> logits_;
};

}  // namespace astrai::infer
