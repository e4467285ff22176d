#include "train/strategy.h"

#include "kernels/cpu/cross_entropy_backward.h"
#include "train/dpo.h"
#include "train/grpo.h"

namespace astrai::train {

MicroStats CrossEntropyStrategy::run(TrainModel& policy, const TrainBatch& batch, float grad_scale) {
  const int64_t T = batch.num_tokens(), V = policy.config().vocab_size;
  MicroStats s;
  s.num_targets = batch.num_targets();
  if (s.num_targets == 0) return s;  // nothing to learn from; contributes no gradient
  float* logits = policy.forward(batch);
  float* row_loss = row_loss_.grow(policy.ops(), static_cast<size_t>(T));
  const float scale = grad_scale / static_cast<float>(s.num_targets);
  s.loss_sum = policy.ops().cross_entropy(logits, batch.targets.data(), T, V, label_smoothing_, scale, row_loss, logits);
  policy.backward(batch, logits);
  return s;
}

MicroStats CrossEntropyStrategy::evaluate(TrainModel& policy, const TrainBatch& batch) {
  const int64_t T = batch.num_tokens(), V = policy.config().vocab_size;
  MicroStats s;
  s.num_targets = batch.num_targets();
  if (s.num_targets == 0) return s;
  float* logits = policy.forward(batch);
  float* row_loss = row_loss_.grow(policy.ops(), static_cast<size_t>(T));
  s.loss_sum = policy.ops().cross_entropy(logits, batch.targets.data(), T, V, label_smoothing_, 0.0f, row_loss, nullptr);
  return s;
}

void target_logprobs(TrainModel& model, const TrainBatch& batch, std::vector<float>* out) {
  const int64_t T = batch.num_tokens();
  ASTRAI_CHECK(model.device() == Device::kCpu, "per-token log-probabilities (dpo, grpo) are computed on the CPU only");
  out->resize(static_cast<size_t>(T));
  kernels::token_logprobs(model.forward(batch), batch.targets.data(), T, model.config().vocab_size, out->data());
}

void backward_through_logprobs(TrainModel& model, const TrainBatch& batch, float* logits, const std::vector<float>& dlogp) {
  const int64_t T = batch.num_tokens();
  ASTRAI_CHECK(model.device() == Device::kCpu, "per-token log-probabilities (dpo, grpo) are computed on the CPU only");
  ASTRAI_CHECK(static_cast<int64_t>(dlogp.size()) == T, "backward_through_logprobs: ", dlogp.size(), " gradients for ",
               T, " rows");
  kernels::token_logprobs_backward(logits, batch.targets.data(), dlogp.data(), T, model.config().vocab_size, logits);
  model.backward(batch, logits);
}

std::vector<double> sequence_logprobs(TrainModel& model, const TrainBatch& batch) {
  std::vector<float> lp;
  target_logprobs(model, batch, &lp);
  std::vector<double> out;
  for (const auto& d : batch.docs) {
    double s = 0.0;
    for (int32_t t = d.begin; t < d.begin + d.len; ++t) s += lp[t];
    out.push_back(s);
  }
  return out;
}

std::unique_ptr<Strategy> make_strategy(const StrategyOptions& o, const TrainModel& reference) {
  if (o.train_type == "seq" || o.train_type == "sft")
    return std::make_unique<CrossEntropyStrategy>(o.train_type, o.label_smoothing);
  if (o.train_type == "dpo") {
    DpoOptions d;
    d.beta = o.dpo_beta;
    d.loss = parse_dpo_loss(o.dpo_loss);
    d.label_smoothing = o.dpo_label_smoothing;
    return std::make_unique<DpoStrategy>(d, reference);
  }
  if (o.train_type == "grpo") {
    GrpoOptions g;
    g.clip_eps = o.clip_eps;
    g.kl_coef = o.kl_coef;
    g.ref_sync_interval = o.ref_sync_interval;
    return std::make_unique<GrpoStrategy>(g, reference);
  }
  fail("unknown --train-type \"", o.train_type, "\" (seq, sft, dpo, grpo)");
}

}  // namespace astrai::train
