#include "train/dpo.h"

#include <cmath>

#include "base/error.h"
#include "kernels/cpu/cross_entropy_backward.h"

namespace astrai::train {

namespace {

// log σ(x) without overflow for large |x|.
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

enum Metric { kRewardChosen, kRewardRejected, kRewardMargin, kRewardAccuracy };

}  // namespace

DpoLoss parse_dpo_loss(const std::string& name) {
  if (name == "sigmoid") return DpoLoss::kSigmoid;
  if (name == "ipo") return DpoLoss::kIpo;
  fail("unknown --dpo-loss \"", name, "\" (sigmoid, ipo)");
}

DpoTerm dpo_term(double h, const DpoOptions& o) {
  const double beta = o.beta;
  if (o.loss == DpoLoss::kIpo) {
    const double d = h - 1.0 / (2.0 * beta);
    return {d * d, 2.0 * d};
  }
  const double eps = o.label_smoothing, z = beta * h;
  // d/dz [−log σ(z)] = −σ(−z); d/dz [−log σ(−z)] = σ(z).
  return {-(1.0 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z), beta * (-(1.0 - eps) * sigmoid(-z) + eps * sigmoid(z))};
}

void add_preference_pair(TrainBatch* batch, const std::vector<int32_t>& chosen, const std::vector<uint8_t>& chosen_mask,
                         const std::vector<int32_t>& rejected, const std::vector<uint8_t>& rejected_mask) {
  ASTRAI_CHECK(chosen.size() >= 2 && rejected.size() >= 2, "a preference pair needs at least 2 tokens per side");
  batch->add_document(chosen, &chosen_mask);
  batch->add_document(rejected, &rejected_mask);
}

DpoStrategy::DpoStrategy(const DpoOptions& options, const TrainModel& reference) : o_(options) {
  ASTRAI_CHECK(o_.beta > 0 && std::isfinite(o_.beta), "--dpo-beta must be positive (got ", o_.beta, ")");
  ASTRAI_CHECK(o_.label_smoothing >= 0 && o_.label_smoothing < 0.5f, "--dpo-label-smoothing must be in [0, 0.5) (got ",
               o_.label_smoothing, ")");
  ASTRAI_CHECK(o_.loss == DpoLoss::kSigmoid || o_.label_smoothing == 0,
               "--dpo-label-smoothing applies to the sigmoid loss only, not to ipo");
  reference_ = make_reference(reference);
}

std::vector<Strategy::Metric> DpoStrategy::metrics() const {
  return {{"rewards_chosen", ""}, {"rewards_rejected", ""}, {"rewards_margin", "margin"}, {"rewards_accuracy", "acc"}};
}

void DpoStrategy::document_scores(const TrainBatch& batch, const float* logp, std::vector<double>* out) {
  out->assign(batch.docs.size(), 0.0);
  token_weight_.resize(batch.docs.size());
  for (size_t d = 0; d < batch.docs.size(); ++d) {
    const auto& doc = batch.docs[d];
    double sum = 0.0;
    int64_t counted = 0;
    for (int32_t t = doc.begin; t < doc.begin + doc.len; ++t) {
      if (batch.targets[t] < 0) continue;
      sum += logp[t];
      ++counted;
    }
    ASTRAI_CHECK(counted > 0, "DPO: document ", d, " of the batch has no response token");
    token_weight_[d] = o_.loss == DpoLoss::kIpo ? 1.0 / static_cast<double>(counted) : 1.0;
    (*out)[d] = sum * token_weight_[d];
  }
}

void DpoStrategy::score_reference(const TrainBatch& batch) {
  ASTRAI_CHECK(batch.docs.size() % 2 == 0 && !batch.docs.empty(), "DPO: a batch holds (chosen, rejected) pairs");
  target_logprobs(*reference_, batch, &logp_);
  document_scores(batch, logp_.data(), &reference_scores_);
}

MicroStats DpoStrategy::pair_losses(const TrainBatch& batch, const float* logits, int64_t vocab, bool with_grad,
                                    float grad_scale) {
  const int64_t T = batch.num_tokens();
  const size_t pairs = batch.docs.size() / 2;
  logp_.resize(static_cast<size_t>(T));
  kernels::token_logprobs(logits, batch.targets.data(), T, vocab, logp_.data());
  document_scores(batch, logp_.data(), &policy_scores_);
  MicroStats s;
  s.num_targets = static_cast<int64_t>(pairs);
  if (with_grad) dlogp_.assign(static_cast<size_t>(T), 0.0f);
  for (size_t i = 0; i < pairs; ++i) {
    const double chosen = policy_scores_[2 * i] - reference_scores_[2 * i];
    const double rejected = policy_scores_[2 * i + 1] - reference_scores_[2 * i + 1];
    const DpoTerm term = dpo_term(chosen - rejected, o_);
    s.loss_sum += term.loss;
    s.metric_sums[kRewardChosen] += o_.beta * chosen;
    s.metric_sums[kRewardRejected] += o_.beta * rejected;
    s.metric_sums[kRewardMargin] += o_.beta * (chosen - rejected);
    s.metric_sums[kRewardAccuracy] += chosen > rejected ? 1.0 : 0.0;
    if (!with_grad) continue;
    // d(mean loss)/dS(chosen) = dloss/dh / pairs; S(rejected) enters with the opposite sign;
    // each counted token's log p enters S with its document's token weight.
    const double g = term.dloss_dh * grad_scale / static_cast<double>(pairs);
    for (size_t side = 0; side < 2; ++side) {
      const auto& doc = batch.docs[2 * i + side];
      const double per_token = (side == 0 ? g : -g) * token_weight_[2 * i + side];
      for (int32_t t = doc.begin; t < doc.begin + doc.len; ++t)
        if (batch.targets[t] >= 0) dlogp_[t] = static_cast<float>(per_token);
    }
  }
  return s;
}

MicroStats DpoStrategy::run(TrainModel& policy, const TrainBatch& batch, float grad_scale) {
  // The reference's scores first: the policy's logits must survive until its backward.
  score_reference(batch);
  float* logits = policy.forward(batch);
  const MicroStats s = pair_losses(batch, logits, policy.config().vocab_size, /*with_grad=*/true, grad_scale);
  backward_through_logprobs(policy, batch, logits, dlogp_);
  return s;
}

MicroStats DpoStrategy::evaluate(TrainModel& policy, const TrainBatch& batch) {
  score_reference(batch);
  return pair_losses(batch, policy.forward(batch), policy.config().vocab_size, /*with_grad=*/false, 0.0f);
}

}  // namespace astrai::train
