// Direct Preference Optimization (Rafailov et al. 2023) and its IPO and conservative
// (label-smoothed) variants.
//
// A DPO batch holds preference pairs as consecutive documents: document 2i is pair i's chosen
// sequence, 2i + 1 its rejected one (add_preference_pair); targets are set on response tokens
// only. With S(x) = Σ log π(y_t | y_<t) over the response tokens of x (for IPO: their mean,
// as in the IPO paper and TRL) and R(x) the same under the frozen reference policy,
//   h    = (S(chosen) − R(chosen)) − (S(rejected) − R(rejected))
//   sigmoid: loss = −(1 − ε)·log σ(β·h) − ε·log σ(−β·h)      (ε: --dpo-label-smoothing)
//   ipo:     loss = (h − 1/(2β))²
// and the micro-batch loss is the mean over its pairs. Metrics per pair: the implicit rewards
// β·(S − R) of the chosen and rejected sides, their margin, and whether chosen > rejected.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "train/strategy.h"

namespace astrai::train {

enum class DpoLoss { kSigmoid, kIpo };
DpoLoss parse_dpo_loss(const std::string& name);  // "sigmoid" | "ipo", else astrai::Error

struct DpoOptions {
  float beta = 0.1f;
  DpoLoss loss = DpoLoss::kSigmoid;
  float label_smoothing = 0.0f;
};

// One pair's loss and its derivative with respect to h.
struct DpoTerm {
  double loss = 0.0;
  double dloss_dh = 0.0;
};
DpoTerm dpo_term(double h, const DpoOptions& options);

// Appends one pair (chosen, then rejected) to a batch; masks mark response tokens.
void add_preference_pair(TrainBatch* batch, const std::vector<int32_t>& chosen, const std::vector<uint8_t>& chosen_mask,
                         const std::vector<int32_t>& rejected, const std::vector<uint8_t>& rejected_mask);

class DpoStrategy final : public Strategy {
 public:
  // The reference policy is a frozen copy of `reference`'s parameters, taken now.
  DpoStrategy(const DpoOptions& options, const TrainModel& reference);
  std::string name() const override { return "dpo"; }
  MicroStats run(TrainModel& policy, const TrainBatch& batch, float grad_scale) override;
  MicroStats evaluate(TrainModel& policy, const TrainBatch& batch) override;
  int64_t count_units(const TrainBatch& batch) const override { return static_cast<int64_t>(batch.docs.size() / 2); }
  std::vector<Metric> metrics() const override;

 private:
  // R per document of the batch into reference_scores_.
  void score_reference(const TrainBatch& batch);
  // Loss and metrics of a batch from the policy's logits; with_grad: also the per-token
  // d(grad_scale · loss)/d(log p) in dlogp_.
  MicroStats pair_losses(const TrainBatch& batch, const float* logits, int64_t vocab, bool with_grad, float grad_scale);
  // S or R per document: Σ (IPO: mean) of log p over the document's counted targets; also
  // sets token_weight_ (1, IPO: 1 / counted targets), the weight of each token's log p in S.
  void document_scores(const TrainBatch& batch, const float* logp, std::vector<double>* out);

  DpoOptions o_;
  std::unique_ptr<TrainModel> reference_;
  std::vector<float> logp_, dlogp_;
  std::vector<double> policy_scores_, reference_scores_, token_weight_;
};

}  // namespace astrai::train
