#include "data/prompts.h"

#include "base/error.h"

namespace astrai::data {

PromptDataset::PromptDataset(Shards shards) : shards_(std::move(shards)) {
  const std::string kind = shards_.kind();
  ASTRAI_CHECK((kind == "prompt" || kind == "imported") && shards_.has("prompt"), shards_.dir(), " holds \"", kind,
               "\" records; --train-type grpo needs prompts (JSONL records with \"prompt\" or \"messages\" and no "
               "response, optionally an \"answer\", made by astrai preprocess)");
  prompt_ = shards_.key("prompt");
  if (shards_.has("answer")) answer_ = shards_.key("answer");
  for (int64_t r = 0; r < prompt_.records(); ++r)
    ASTRAI_CHECK(prompt_.record_end(r) > prompt_.record_begin(r), shards_.dir(), ": prompt ", r, " is empty");
  ASTRAI_CHECK(prompt_.records() > 0, shards_.dir(), ": no prompts");
}

void PromptDataset::prompt(int64_t i, std::vector<int32_t>* ids) const {
  ASTRAI_CHECK(i >= 0 && i < size(), "prompt ", i, " out of range (", size(), " prompts)");
  const int64_t b = prompt_.record_begin(i), e = prompt_.record_end(i);
  ids->resize(static_cast<size_t>(e - b));
  prompt_.read_i32(b, e, ids->data());
}

std::string PromptDataset::answer(int64_t i) const {
  if (!answer_) return {};
  const int64_t b = answer_->record_begin(i), e = answer_->record_end(i);
  const auto* bytes = answer_->as<uint8_t>();
  return std::string(reinterpret_cast<const char*>(bytes + b), static_cast<size_t>(e - b));
}

}  // namespace astrai::data
