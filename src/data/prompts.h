// Prompts for GRPO rollouts: the "prompt" dataset `astrai preprocess` writes from
// {"prompt" or "messages" (+ "answer")} records (keys prompt, and answer as UTF-8 bytes when
// the records have one; a chat prompt is rendered with the generation prompt).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/shard.h"

namespace astrai::data {

class PromptDataset {
 public:
  // Throws astrai::Error when the dataset is not a prompt dataset (naming what it is) or holds
  // an empty prompt.
  explicit PromptDataset(Shards shards);

  int64_t size() const { return shards_.key("prompt").records(); }
  bool has_answers() const { return answer_.has_value(); }
  const Shards& shards() const { return shards_; }

  void prompt(int64_t i, std::vector<int32_t>* ids) const;
  std::string answer(int64_t i) const;  // "" without answers

 private:
  Shards shards_;
  ShardKey prompt_;
  std::optional<ShardKey> answer_;
};

}  // namespace astrai::data
