#include "train/grpo.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "kernels/cpu/cross_entropy_backward.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "train/params.h"

namespace astrai::train {

namespace {

enum Metric { kKl, kClipFraction, kRatio };

const char* kReferenceFile = "reference.safetensors";

}  // namespace

GrpoStrategy::GrpoStrategy(const GrpoOptions& options, const TrainModel& reference) : o_(options) {
  ASTRAI_CHECK(o_.clip_eps > 0 && o_.clip_eps < 1, "--clip-eps must be in (0, 1) (got ", o_.clip_eps, ")");
  ASTRAI_CHECK(o_.kl_coef >= 0 && std::isfinite(o_.kl_coef), "--kl-coef must be >= 0 (got ", o_.kl_coef, ")");
  ASTRAI_CHECK(o_.ref_sync_interval >= 0, "--ref-sync-interval must be >= 0");
  // Under LoRA the reference is the frozen base itself, which a sync would have to replace.
  ASTRAI_CHECK(reference.trainable() || o_.ref_sync_interval == 0,
               "--ref-sync-interval is not supported with LoRA (the reference is the frozen base model)");
  reference_ = make_reference(reference);
  reference_is_base_ = !reference.trainable();
}

std::vector<Strategy::Metric> GrpoStrategy::metrics() const {
  return {{"kl", "kl"}, {"clip_fraction", ""}, {"ratio", ""}};
}

MicroStats GrpoStrategy::losses(const TrainBatch& batch, const float* logits, int64_t vocab, bool with_grad,
                                float grad_scale) {
  const int64_t T = batch.num_tokens();
  const size_t docs = batch.docs.size();
  ASTRAI_CHECK(batch.advantages.size() == docs, "GRPO: ", batch.advantages.size(), " advantages for ", docs,
               " completions");
  ASTRAI_CHECK(batch.behaviour_logp.empty() || static_cast<int64_t>(batch.behaviour_logp.size()) == T,
               "GRPO: behaviour log-probabilities do not cover the batch");
  logp_.resize(static_cast<size_t>(T));
  kernels::token_logprobs(logits, batch.targets.data(), T, vocab, logp_.data());
  if (with_grad) dlogp_.assign(static_cast<size_t>(T), 0.0f);
  MicroStats s;
  s.num_targets = static_cast<int64_t>(docs);
  const double lo = 1.0 - o_.clip_eps, hi = 1.0 + o_.clip_eps, beta = o_.kl_coef;
  for (size_t d = 0; d < docs; ++d) {
    const auto& doc = batch.docs[d];
    const double adv = batch.advantages[d];
    int64_t n = 0;
    for (int32_t t = doc.begin; t < doc.begin + doc.len; ++t) n += batch.targets[t] >= 0;
    ASTRAI_CHECK(n > 0, "GRPO: completion ", d, " of the batch has no generated token");
    double loss = 0, kl_sum = 0, clipped = 0, ratio_sum = 0;
    const double per_token = with_grad ? grad_scale / (static_cast<double>(docs) * static_cast<double>(n)) : 0.0;
    for (int32_t t = doc.begin; t < doc.begin + doc.len; ++t) {
      if (batch.targets[t] < 0) continue;
      const double lp = logp_[t];
      const double ratio = batch.behaviour_logp.empty() ? 1.0 : std::exp(lp - batch.behaviour_logp[t]);
      const double clipped_ratio = std::min(std::max(ratio, lo), hi);
      const bool is_clipped = (adv > 0 && ratio > hi) || (adv < 0 && ratio < lo);
      const double diff = ref_logp_[t] - lp;  // log q − log p
      const double kl = std::exp(diff) - diff - 1.0;
      loss += -std::min(ratio * adv, clipped_ratio * adv) + beta * kl;
      kl_sum += kl;
      clipped += is_clipped;
      ratio_sum += ratio;
      if (with_grad) dlogp_[t] = static_cast<float>(per_token * ((is_clipped ? 0.0 : -adv * ratio) + beta * (1.0 - std::exp(diff))));
    }
    const double inv = 1.0 / static_cast<double>(n);
    s.loss_sum += loss * inv;
    s.metric_sums[kKl] += kl_sum * inv;
    s.metric_sums[kClipFraction] += clipped * inv;
    s.metric_sums[kRatio] += ratio_sum * inv;
  }
  return s;
}

MicroStats GrpoStrategy::run(TrainModel& policy, const TrainBatch& batch, float grad_scale) {
  target_logprobs(*reference_, batch, &ref_logp_);  // before the policy's logits, which must survive
  float* logits = policy.forward(batch);
  const MicroStats s = losses(batch, logits, policy.config().vocab_size, /*with_grad=*/true, grad_scale);
  backward_through_logprobs(policy, batch, logits, dlogp_);
  return s;
}

MicroStats GrpoStrategy::evaluate(TrainModel& policy, const TrainBatch& batch) {
  target_logprobs(*reference_, batch, &ref_logp_);
  return losses(batch, policy.forward(batch), policy.config().vocab_size, /*with_grad=*/false, 0.0f);
}

void GrpoStrategy::after_update(int64_t step, const TrainModel& policy) {
  if (o_.ref_sync_interval > 0 && step % o_.ref_sync_interval == 0) reference_->copy_parameters_from(policy);
}

void GrpoStrategy::save_state(const std::string& dir) const {
  if (reference_is_base_) return;  // the base checkpoint is the reference
  model::write_safetensors(dir + "/" + kReferenceFile, {{"reference", buffer_view(on_host(reference_->params()))}});
}

void GrpoStrategy::load_state(const std::string& dir) {
  if (reference_is_base_) return;
  const auto t = model::read_safetensors(dir + "/" + kReferenceFile).tensors;
  auto it = t.find("reference");
  ASTRAI_CHECK(it != t.end() && it->second.dtype() == DType::kF32 &&
                   static_cast<size_t>(it->second.numel()) == reference_->params().size(),
               dir, "/", kReferenceFile, ": missing or mis-sized reference policy");
  FloatBuffer& ref = reference_->params();
  ref.ops().to_device(ref.data(), it->second.raw(), ref.size() * sizeof(float));
}

}  // namespace astrai::train
