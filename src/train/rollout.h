// GRPO's batch source: online rollouts from our own inference engine on the trainer's live
// weights (train/live_model.h: the engine's Transformer reads the parameter buffer in place).
//
// fill() takes prompt indices from the sampler; for each prompt the engine generates
// --group-size completions as ONE request with n choices, so the group shares the prompt's
// prefill and KV pages (continuous batching runs every request of the micro-batch together).
// Each completion is scored by the reward (train/rewards.h); advantages are normalised per
// group, A = (r − mean) / (std + 1e-4) with the sample standard deviation (N − 1), as TRL.
// The batch then holds one document per completion: prompt (not trained) + generated tokens
// (trained, EOS included when the completion stopped on it).
//
// Policy versions: the version is the number of optimizer updates applied to the weights.
// after_update() stamps the new version on the engine's prefix cache, which drops every entry
// computed with older weights, so a rollout never reuses K/V of a previous policy. Rollouts
// record the version they were generated with; `staleness` in the metrics is how many updates
// the weights have moved since (> 0 only with --ppo-epochs > 1).
//
// Sampling is seeded from (--seed, version, prompt index, slot): a resumed run regenerates
// the same rollouts. Validation (held-out prompts) generates with seeds that do not depend on
// the version, so successive validations compare the policies on the same draws.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/prompts.h"
#include "model/config.h"
#include "train/batch_source.h"
#include "train/model.h"

namespace astrai::infer {
class Engine;
}
namespace astrai::tokenizer {
class Tokenizer;
}

namespace astrai::train {

class RewardFunction;

struct RolloutOptions {
  int32_t group_size = 4;
  int32_t max_new_tokens = 64;
  float temperature = 1.0f;
  float top_p = 1.0f;
  uint64_t seed = 42;
  std::string reward = "exact-match";
  double reward_timeout = 10.0;
  // Record the generating policy's log p of every completion token (needed when the batch is
  // trained on for several updates, --ppo-epochs > 1).
  bool behaviour_logp = false;
};

class RolloutSource final : public BatchSource {
 public:
  // `weights`: views of the policy's live weights (merged with its LoRA adapters, if any),
  // which the engine generates with.
  RolloutSource(data::Shards shards, TrainModel& policy, std::map<std::string, Tensor> weights,
                const std::string& tokenizer_dir, const RolloutOptions& options);
  ~RolloutSource() override;

  int64_t size() const override { return data_.size(); }
  std::string sample_noun() const override;
  void fill(const std::vector<int64_t>& samples, TrainBatch* batch) override;
  void add_metrics(Json* rec) override;
  void after_update(int64_t version) override;
  bool validates_itself() const override { return true; }
  Json validate(const std::vector<int64_t>& samples) override;

 private:
  struct Group;  // one prompt's completions and rewards
  std::vector<Group> generate(const std::vector<int64_t>& samples, bool validation);

  data::PromptDataset data_;
  TrainModel& policy_;
  RolloutOptions o_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<infer::Engine> engine_;
  std::unique_ptr<RewardFunction> reward_;
  int64_t version_ = 0;
  int64_t rollout_version_ = 0;  // version the last fill() generated with
  // Since the last add_metrics(): Σ reward, Σ reward², completions, Σ completion tokens,
  // generation seconds, Σ |advantage|, groups whose rewards were all equal.
  double reward_sum_ = 0, reward_sq_ = 0, completion_tokens_ = 0, gen_seconds_ = 0, abs_adv_ = 0;
  int64_t completions_ = 0, flat_groups_ = 0, groups_ = 0;
  std::vector<float> logp_;
};

}  // namespace astrai::train
