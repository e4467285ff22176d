#include "data/preference.h"

#include <algorithm>

#include "base/error.h"

namespace astrai::data {

PreferenceDataset::PreferenceDataset(Shards shards, int64_t max_tokens)
    : shards_(std::move(shards)), max_tokens_(max_tokens) {
  const std::string kind = shards_.kind();
  // An HDF5 import in the reference's DPO layout has the same keys.
  ASTRAI_CHECK(kind == "preference" || (kind == "imported" && shards_.has("chosen")), shards_.dir(), " holds \"", kind,
               "\" records; --train-type dpo needs preference pairs (JSONL records with \"prompt\" or "
               "\"messages\", \"chosen\" and \"rejected\", made by astrai preprocess)");
  for (const char* k : {"chosen", "chosen_mask", "rejected", "rejected_mask"})
    ASTRAI_CHECK(shards_.has(k), shards_.dir(), ": preference dataset without the \"", k, "\" key");
  ASTRAI_CHECK(max_tokens_ >= 2, "--seq-len must be at least 1 for preference pairs");
  chosen_ = shards_.key("chosen");
  chosen_mask_ = shards_.key("chosen_mask");
  rejected_ = shards_.key("rejected");
  rejected_mask_ = shards_.key("rejected_mask");
  ASTRAI_CHECK(chosen_.records() == rejected_.records(), shards_.dir(), ": ", chosen_.records(),
               " chosen but ", rejected_.records(), " rejected records");
  for (int64_t r = 0; r < chosen_.records(); ++r) {
    const int64_t kc = kept_length(chosen_, r), kr = kept_length(rejected_, r);
    if (!has_response(chosen_mask_, r, kc) || !has_response(rejected_mask_, r, kr)) {
      ++dropped_;
      continue;
    }
    truncated_ += kc < chosen_.record_end(r) - chosen_.record_begin(r) ||
                  kr < rejected_.record_end(r) - rejected_.record_begin(r);
    records_.push_back(r);
  }
  ASTRAI_CHECK(!records_.empty(), shards_.dir(), ": none of its ", chosen_.records(),
               " preference pairs has a response token within --seq-len ", max_tokens_ - 1,
               " (the prompts fill the window): raise --seq-len");
}

int64_t PreferenceDataset::kept_length(const ShardKey& ids, int64_t r) const {
  return std::min(ids.record_end(r) - ids.record_begin(r), max_tokens_);
}

// Target i (the token at i + 1) counts when mask[i + 1] is set: the first token never does.
bool PreferenceDataset::has_response(const ShardKey& mask, int64_t r, int64_t kept) const {
  const int64_t b = mask.record_begin(r);
  for (int64_t i = 1; i < kept; ++i)
    if (mask.at_i32(b + i) != 0) return true;
  return false;
}

void PreferenceDataset::read_side(const ShardKey& ids, const ShardKey& mask, int64_t r, std::vector<int32_t>* tokens,
                                  std::vector<uint8_t>* m) const {
  const int64_t b = ids.record_begin(r), n = kept_length(ids, r);
  tokens->resize(static_cast<size_t>(n));
  ids.read_i32(b, b + n, tokens->data());
  m->resize(static_cast<size_t>(n));
  const int64_t mb = mask.record_begin(r);
  for (int64_t i = 0; i < n; ++i) (*m)[i] = mask.at_i32(mb + i) != 0;
}

void PreferenceDataset::get(int64_t i, PreferencePair* out) const {
  ASTRAI_CHECK(i >= 0 && i < size(), "preference pair ", i, " out of range (", size(), " pairs)");
  const int64_t r = records_[static_cast<size_t>(i)];
  read_side(chosen_, chosen_mask_, r, &out->chosen, &out->chosen_mask);
  read_side(rejected_, rejected_mask_, r, &out->rejected, &out->rejected_mask);
}

}  // namespace astrai::data
