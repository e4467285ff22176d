#include "infer/runner.h"

#include <algorithm>

#include "base/error.h"

namespace astrai::infer {

void Runner::run(const std::vector<StepItem>& step, const KvStorage& kv, const std::vector<uint8_t>& on_device) {
  batch_.tokens.clear();
  batch_.positions.clear();
  batch_.logit_rows.clear();
  batch_.seqs.resize(step.size());
  first_row_.resize(step.size());
  for (size_t i = 0; i < step.size(); ++i) {
    const StepItem& item = step[i];
    const Sequence& s = *item.seq;
    model::SeqSpan& span = batch_.seqs[i];
    span.token_begin = batch_.num_tokens();
    span.num_tokens = item.num_tokens;
    span.context_len = s.num_computed;
    span.page_table.assign(s.pages.begin(), s.pages.end());
    for (int32_t j = 0; j < item.num_tokens; ++j) {
      batch_.tokens.push_back(s.tokens[s.num_computed + j]);
      batch_.positions.push_back(s.num_computed + j);  // each sequence's own positions
    }
    first_row_[i] = static_cast<int32_t>(batch_.logit_rows.size());
    if (item.all_rows) {
      for (int32_t j = 0; j < item.num_tokens; ++j) batch_.logit_rows.push_back(span.token_begin + j);
    } else if (item.sample) {
      batch_.logit_rows.push_back(span.token_begin + item.num_tokens - 1);
    }
  }
  const size_t need = batch_.logit_rows.size() * size_t(vocab());
  if (logits_.size() < need) logits_.resize(need);
  // A step whose every chunk stops mid-prompt wants no logits; the forward still runs to
  // write K/V. Pass a valid pointer either way.
  if (logits_.empty()) logits_.resize(vocab());
  if (batch_.logit_rows.empty()) {
    // An empty logit_rows means "every row" to the model; ask for one row and ignore it.
    batch_.logit_rows.push_back(batch_.num_tokens() - 1);
  }
  ASTRAI_CHECK(on_device.empty() || on_device.size() == step.size(), "runner: ", on_device.size(),
               " on_device flags for ", step.size(), " items");
  const bool keep = backend_.can_sample() && std::any_of(on_device.begin(), on_device.end(), [](uint8_t d) { return d; });
  if (!keep) {
    backend_.forward(batch_, kv, logits_.data());
    return;
  }
  // The logits stay on the device; the rows of the items sampled on the host come back, each
  // run of consecutive host rows in one copy.
  backend_.forward(batch_, kv, nullptr);
  const auto rows_of = [&](size_t i) -> int32_t {
    return step[i].all_rows ? step[i].num_tokens : step[i].sample ? 1 : 0;
  };
  int32_t first = 0, count = 0;
  for (size_t i = 0; i <= step.size(); ++i) {
    const bool host = i < step.size() && !on_device[i] && rows_of(i) > 0;
    if (host && count > 0 && first + count == first_row_[i]) {
      count += rows_of(i);
      continue;
    }
    if (count > 0) backend_.copy_logits(first, count, logits_.data() + size_t(first) * vocab());
    first = host ? first_row_[i] : 0;
    count = host ? rows_of(i) : 0;
  }
}

}  // namespace astrai::infer
