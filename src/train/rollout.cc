#include "train/rollout.h"

#include <cmath>

#include "base/error.h"
#include "base/rng.h"
#include "base/timer.h"
#include "infer/engine.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer.h"
#include "train/live_model.h"
#include "train/rewards.h"
#include "train/strategy.h"

namespace astrai::train {

struct RolloutSource::Group {
  std::vector<int32_t> prompt;
  std::vector<std::vector<int32_t>> completions;
  std::vector<double> rewards;
};

namespace {

uint64_t rollout_seed(uint64_t seed, int64_t version, int64_t sample, size_t slot) {
  SplitMix64 r(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(version + 1)));
  r.next();
  SplitMix64 s(r.next() ^ (0xBF58476D1CE4E5B9ull * static_cast<uint64_t>(sample + 1)) ^ (slot << 32));
  return s.next();
}

}  // namespace

RolloutSource::RolloutSource(data::Shards shards, TrainModel& policy, std::map<std::string, Tensor> weights,
                             const std::string& tokenizer_dir, const RolloutOptions& options)
    : data_(std::move(shards)), policy_(policy), o_(options) {
  ASTRAI_CHECK(o_.group_size >= 2, "--group-size must be at least 2 (advantages compare completions of a prompt)");
  ASTRAI_CHECK(o_.max_new_tokens >= 1, "--max-new-tokens must be positive");
  ASTRAI_CHECK(o_.temperature > 0, "--temperature must be positive for rollouts (GRPO needs different completions)");
  ASTRAI_CHECK(!tokenizer_dir.empty(), "--train-type grpo needs the tokenizer (--tokenizer DIR, or a --model "
               "directory that holds tokenizer.json) to score completions as text");
  reward_ = make_reward(o_.reward, o_.reward_timeout);
  ASTRAI_CHECK(!reward_->needs_answer() || data_.has_answers(), data_.shards().dir(), ": --reward ", o_.reward,
               " compares with each prompt's \"answer\", and these prompt records have none");
  tokenizer_ = std::make_shared<const tokenizer::Tokenizer>(tokenizer::Tokenizer::load(tokenizer_dir));
  const model::ModelConfig& cfg = policy_.config();
  auto model = std::make_shared<const model::Transformer>(cfg, live_weights(weights, cfg));
  infer::EngineOptions eo;
  eo.max_running = 256;
  eo.max_queue = 1 << 16;
  engine_ = std::make_unique<infer::Engine>(std::move(model), tokenizer_, eo);
}

RolloutSource::~RolloutSource() = default;

std::string RolloutSource::sample_noun() const {
  return str_cat("prompts x ", o_.group_size, " completions (up to ", o_.max_new_tokens, " new tokens)");
}

std::vector<RolloutSource::Group> RolloutSource::generate(const std::vector<int64_t>& samples, bool validation) {
  std::vector<Group> groups(samples.size());
  std::vector<infer::RequestHandle> handles;
  for (size_t i = 0; i < samples.size(); ++i) {
    data_.prompt(samples[i], &groups[i].prompt);
    infer::GenerationRequest req;
    req.prompt_ids = groups[i].prompt;
    req.sampling.temperature = o_.temperature;
    req.sampling.top_p = o_.top_p;
    req.sampling.max_tokens = o_.max_new_tokens;
    req.sampling.n = o_.group_size;
    req.sampling.seed = rollout_seed(o_.seed, validation ? -1 : version_, samples[i], validation ? 0 : i);
    handles.push_back(engine_->submit(std::move(req)));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    const infer::GenerationResult r = handles[i].wait();
    ASTRAI_CHECK(r.error.empty(), "rollout of prompt ", samples[i], " failed: ", r.error);
    RewardInput in;
    in.prompt = tokenizer_->decode(groups[i].prompt, /*skip_special_tokens=*/true);
    in.answer = data_.answer(samples[i]);
    for (const auto& c : r.choices) {
      groups[i].completions.push_back(c.token_ids);
      in.completion = c.text;
      groups[i].rewards.push_back(reward_->score(in));
    }
  }
  return groups;
}

void RolloutSource::fill(const std::vector<int64_t>& samples, TrainBatch* b) {
  Timer timer;
  const std::vector<Group> groups = generate(samples, /*validation=*/false);
  gen_seconds_ += timer.seconds();
  rollout_version_ = version_;
  *b = TrainBatch{};
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (const Group& g : groups) {
    const double n = static_cast<double>(g.rewards.size());
    double mean = 0, var = 0;
    for (double r : g.rewards) mean += r / n;
    for (double r : g.rewards) var += (r - mean) * (r - mean) / (n - 1);
    const double sd = std::sqrt(var);
    ++groups_;
    flat_groups_ += sd == 0;
    for (size_t c = 0; c < g.completions.size(); ++c) {
      ids = g.prompt;
      ids.insert(ids.end(), g.completions[c].begin(), g.completions[c].end());
      mask.assign(g.prompt.size(), 0);
      mask.resize(ids.size(), 1);
      b->add_document(ids, &mask);
      const double adv = (g.rewards[c] - mean) / (sd + 1e-4);
      b->advantages.push_back(static_cast<float>(adv));
      reward_sum_ += g.rewards[c];
      reward_sq_ += g.rewards[c] * g.rewards[c];
      abs_adv_ += std::fabs(adv);
      completion_tokens_ += static_cast<double>(g.completions[c].size());
      ++completions_;
    }
  }
  if (o_.behaviour_logp) {  // without dropout: the generating policy's own probabilities
    const EvalMode eval(policy_);
    target_logprobs(policy_, *b, &b->behaviour_logp);
  }
}

void RolloutSource::add_metrics(Json* rec) {
  if (completions_ > 0) {
    const double n = static_cast<double>(completions_);
    const double mean = reward_sum_ / n;
    (*rec)["reward_mean"] = mean;
    (*rec)["reward_std"] = std::sqrt(std::max(0.0, reward_sq_ / n - mean * mean));
    (*rec)["advantage_abs_mean"] = abs_adv_ / n;
    (*rec)["flat_groups"] = groups_ > 0 ? static_cast<double>(flat_groups_) / static_cast<double>(groups_) : 0.0;
    (*rec)["completion_tokens_mean"] = completion_tokens_ / n;
    (*rec)["rollout_tokens_per_s"] = gen_seconds_ > 0 ? completion_tokens_ / gen_seconds_ : 0.0;
    (*rec)["rollout_seconds"] = gen_seconds_;
  }
  (*rec)["policy_version"] = version_;            // of the weights this update started from
  (*rec)["rollout_version"] = rollout_version_;   // of the weights that generated its rollouts
  (*rec)["staleness"] = version_ - rollout_version_;
  reward_sum_ = reward_sq_ = completion_tokens_ = gen_seconds_ = abs_adv_ = 0;
  completions_ = flat_groups_ = groups_ = 0;
}

void RolloutSource::after_update(int64_t version) {
  version_ = version;
  engine_->invalidate_prefix_cache(static_cast<uint64_t>(version));
}

Json RolloutSource::validate(const std::vector<int64_t>& samples) {
  double sum = 0, tokens = 0, n = 0;
  for (const Group& g : generate(samples, /*validation=*/true)) {
    for (size_t c = 0; c < g.rewards.size(); ++c) {
      sum += g.rewards[c];
      tokens += static_cast<double>(g.completions[c].size());
      n += 1;
    }
  }
  return Json{{"val_reward_mean", n > 0 ? sum / n : 0.0}, {"val_completion_tokens_mean", n > 0 ? tokens / n : 0.0}};
}

}  // namespace astrai::train
