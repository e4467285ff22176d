// Preference pairs for DPO: the "preference" dataset `astrai preprocess` writes from
// {"prompt" or "messages", "chosen", "rejected"} records (keys chosen, chosen_mask, rejected,
// rejected_mask; one record per pair; mask 1 on response tokens, 0 on the prompt).
//
// Each side is cut to max_tokens tokens (the prompt is kept, the end of the response is
// dropped). A pair where either side keeps no response token after the cut carries no
// preference signal and is left out (counted in dropped()), so every pair the dataset hands
// out has at least one counted target on both sides.
#pragma once

#include <cstdint>
#include <vector>

#include "data/shard.h"

namespace astrai::data {

struct PreferencePair {
  std::vector<int32_t> chosen, rejected;            // token ids, prompt + response
  std::vector<uint8_t> chosen_mask, rejected_mask;  // 1 on response tokens
};

class PreferenceDataset {
 public:
  // Throws astrai::Error when the dataset is not a preference dataset (naming what it is and
  // what `astrai train --train-type dpo` needs), or when no pair survives the cut.
  PreferenceDataset(Shards shards, int64_t max_tokens);

  // Usable pairs (indices 0 .. size() - 1 map to the kept records in order).
  int64_t size() const { return static_cast<int64_t>(records_.size()); }
  // Records left out because a side had no response token within max_tokens.
  int64_t dropped() const { return dropped_; }
  int64_t truncated() const { return truncated_; }  // kept pairs with a side cut short
  const Shards& shards() const { return shards_; }

  // Fills `out` with pair i (vectors reused).
  void get(int64_t i, PreferencePair* out) const;

 private:
  // Tokens kept of record r of a side, and whether a response token is among them.
  int64_t kept_length(const ShardKey& ids, int64_t r) const;
  bool has_response(const ShardKey& mask, int64_t r, int64_t kept) const;
  void read_side(const ShardKey& ids, const ShardKey& mask, int64_t r, std::vector<int32_t>* tokens,
                 std::vector<uint8_t>* m) const;

  Shards shards_;
  ShardKey chosen_, chosen_mask_, rejected_, rejected_mask_;
  int64_t max_tokens_ = 0;
  std::vector<int64_t> records_;
  int64_t dropped_ = 0, truncated_ = 0;
};

}  // namespace astrai::data
