#include "infer/runner.h"

namespace astrai::infer {

void Runner::run(const std::vector<StepItem>& step, const KvStorage& kv) {
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
  backend_.forward(batch_, kv, logits_.data());
}

}  // namespace astrai::infer
