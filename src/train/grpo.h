// GRPO (Shao et al. 2024, DeepSeekMath): the policy-gradient loss over a batch of rollouts.
//
// A GRPO batch holds one document per completion: its prompt (targets ignored) followed by
// the generated tokens (targets counted), with TrainBatch::advantages[d] the completion's
// group-normalised advantage and TrainBatch::behaviour_logp[t] the log-probability of row t's
// target under the policy that generated it (empty: the policy being trained generated the
// batch, so every ratio is 1). With log p the policy's, log q the frozen reference policy's:
//   ratio_t = exp(log p_t − behaviour_t)
//   kl_t    = exp(log q_t − log p_t) − (log q_t − log p_t) − 1      (k3, unbiased, ≥ 0)
//   loss    = mean over completions of the mean over their tokens of
//             −min(ratio_t·A, clip(ratio_t, 1 − ε, 1 + ε)·A) + β·kl_t
// (ε: --clip-eps, β: --kl-coef). Metrics: mean KL per token, the fraction of tokens whose
// ratio was clipped, and the mean ratio.
// The reference policy starts as the starting weights and is set to the current policy every
// --ref-sync-interval updates (0: never); checkpoints keep it (reference.safetensors).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "train/strategy.h"

namespace astrai::train {

struct GrpoOptions {
  float clip_eps = 0.2f;
  float kl_coef = 0.01f;
  int64_t ref_sync_interval = 0;
};

class GrpoStrategy final : public Strategy {
 public:
  GrpoStrategy(const GrpoOptions& options, const TrainModel& reference);
  std::string name() const override { return "grpo"; }
  MicroStats run(TrainModel& policy, const TrainBatch& batch, float grad_scale) override;
  MicroStats evaluate(TrainModel& policy, const TrainBatch& batch) override;
  int64_t count_units(const TrainBatch& batch) const override { return static_cast<int64_t>(batch.docs.size()); }
  std::vector<Metric> metrics() const override;
  void after_update(int64_t step, const TrainModel& policy) override;
  void save_state(const std::string& dir) const override;
  void load_state(const std::string& dir) override;

 private:
  MicroStats losses(const TrainBatch& batch, const float* logits, int64_t vocab, bool with_grad, float grad_scale);

  GrpoOptions o_;
  std::unique_ptr<TrainModel> reference_;
  bool reference_is_base_ = false;  // LoRA: a view of the frozen base, never synced or saved
  std::vector<float> logp_, ref_logp_, dlogp_;
};

}  // namespace astrai::train
