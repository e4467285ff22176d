// Training strategies: what loss a micro-batch contributes and how its gradient reaches the
// model. The trainer calls run() for each micro-batch of an optimizer step (gradients
// accumulate), all-reduces gradients through a Communicator (communicator.h), clips, then
// steps AdamW.
// A strategy may own frozen model copies (DPO's reference policy, GRPO's reference and old
// policy) and use per-sequence log-probabilities (sequence_logprobs below).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/memory.h"
#include "train/model.h"
#include "train/train_batch.h"

namespace astrai::train {

inline constexpr int kMaxMetrics = 4;

struct MicroStats {
  double loss_sum = 0.0;    // Σ loss over the units the loss averages over
  int64_t num_targets = 0;  // those units: counted target tokens (seq, sft), pairs (dpo)
  // Σ over the same units of the strategy's metrics (Strategy::metrics(), in order).
  std::array<double, kMaxMetrics> metric_sums{};
  double loss() const { return num_targets > 0 ? loss_sum / static_cast<double>(num_targets) : 0.0; }
  // Sums of several micro-batches (an update, a validation).
  void add(const MicroStats& o) {
    loss_sum += o.loss_sum;
    num_targets += o.num_targets;
    for (int k = 0; k < kMaxMetrics; ++k) metric_sums[k] += o.metric_sums[k];
  }
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // Forward + loss + backward of one micro-batch; gradients of grad_scale·loss accumulate
  // into policy.grads(). The loss is the mean over the micro-batch's counted targets.
  virtual MicroStats run(TrainModel& policy, const TrainBatch& batch, float grad_scale) = 0;
  // Loss without gradients (validation).
  virtual MicroStats evaluate(TrainModel& policy, const TrainBatch& batch) = 0;
  // The MicroStats::num_targets run() will report for `batch`, known before the forward: the
  // trainer weights each rank's gradient by its share of the global count (data parallel).
  virtual int64_t count_units(const TrainBatch& batch) const { return batch.num_targets(); }
  // The metrics MicroStats::metric_sums holds (at most kMaxMetrics, in order), reported per
  // update as their mean over the units: in metrics.jsonl under `key`, and on the progress
  // line as `label` when it is not empty.
  struct Metric {
    std::string key, label;
  };
  virtual std::vector<Metric> metrics() const { return {}; }
  // Called after optimizer update `step` (1-based) was applied to `policy`.
  virtual void after_update(int64_t /*step*/, const TrainModel& /*policy*/) {}
  // State a checkpoint must keep beyond the weights and the optimizer (GRPO's reference
  // policy), written into and read from a checkpoint directory.
  virtual void save_state(const std::string& /*dir*/) const {}
  virtual void load_state(const std::string& /*dir*/) {}
};

// `seq`: next-token cross-entropy with label smoothing (PyTorch semantics) on every target.
// `sft`: the same on targets whose loss mask is set (prompt tokens carry kIgnore targets);
// batches for both come from TrainBatch, so the two differ only in how targets are masked.
class CrossEntropyStrategy final : public Strategy {
 public:
  CrossEntropyStrategy(std::string name, float label_smoothing)
      : name_(std::move(name)), label_smoothing_(label_smoothing) {}
  std::string name() const override { return name_; }
  MicroStats run(TrainModel& policy, const TrainBatch& batch, float grad_scale) override;
  MicroStats evaluate(TrainModel& policy, const TrainBatch& batch) override;

 private:
  std::string name_;
  float label_smoothing_;
  backend::Buffer row_loss_;  // in the policy's device memory
};

// Σ log p(target) per document of the batch (targets < 0 skipped): the per-sequence
// log-probability DPO and GRPO are built on. Runs a forward only.
std::vector<double> sequence_logprobs(TrainModel& model, const TrainBatch& batch);

// log p of each row's target under `model` into *out (0 where the row has no target); one
// forward. Reference policies and GRPO's behaviour policy score batches with it.
void target_logprobs(TrainModel& model, const TrainBatch& batch, std::vector<float>* out);

// Losses built on per-token log-probabilities: given d(loss)/d(log p_t) for every row, turns
// `logits` (the policy's forward output, overwritten) into dlogits and runs the backward,
// accumulating into model.grads().
void backward_through_logprobs(TrainModel& model, const TrainBatch& batch, float* logits, const std::vector<float>& dlogp);

// What --train-type and its flags choose.
struct StrategyOptions {
  std::string train_type = "seq";
  float label_smoothing = 0.0f;  // seq, sft
  float dpo_beta = 0.1f;
  std::string dpo_loss = "sigmoid";  // sigmoid | ipo
  float dpo_label_smoothing = 0.0f;  // conservative DPO: the chance a label is flipped
  float clip_eps = 0.2f;             // grpo
  float kl_coef = 0.01f;
  int64_t ref_sync_interval = 0;
};

// Makes the strategy. `reference` gives the frozen reference policy's weights to strategies
// that keep one (dpo, grpo: the strategy copies them once, here); others ignore it.
std::unique_ptr<Strategy> make_strategy(const StrategyOptions& options, const TrainModel& reference);

}  // namespace astrai::train
