// A training batch: documents packed without padding, each its own causal sequence
// (attention never crosses documents; positions restart at 0 per document unless given).
// targets[t] is the token predicted from row t, or < 0 when row t carries no loss.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_backward.h"

namespace astrai::train {

inline constexpr int32_t kIgnore = -100;

struct TrainBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> targets;
  std::vector<kernels::AttnSpan> docs;
  // GRPO only (grpo.h): each document's advantage, and the behaviour policy's log p of each
  // row's target (empty: the policy being trained generated the batch).
  std::vector<float> advantages;
  std::vector<float> behaviour_logp;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_targets() const {
    int64_t n = 0;
    for (int32_t t : targets) n += t >= 0;
    return n;
  }
  // Appends one document: inputs ids[0..n-2], targets ids[1..n-1]; when loss_mask is given
  // (same length as ids), target i counts only if loss_mask[i + 1] != 0.
  void add_document(const std::vector<int32_t>& ids, const std::vector<uint8_t>* loss_mask = nullptr) {
    if (ids.size() < 2) return;
    kernels::AttnSpan span;
    span.begin = static_cast<int32_t>(tokens.size());
    span.len = static_cast<int32_t>(ids.size() - 1);
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      tokens.push_back(ids[i]);
      positions.push_back(static_cast<int32_t>(i));
      const bool counted = loss_mask == nullptr || (*loss_mask)[i + 1] != 0;
      targets.push_back(counted ? ids[i + 1] : kIgnore);
    }
    docs.push_back(span);
  }

  // Appends rows with explicit inputs/targets/positions as one document (already shifted).
  void add_rows(const int32_t* in, const int32_t* tgt, const int32_t* pos, int32_t n) {
    kernels::AttnSpan span{static_cast<int32_t>(tokens.size()), n};
    tokens.insert(tokens.end(), in, in + n);
    targets.insert(targets.end(), tgt, tgt + n);
    positions.insert(positions.end(), pos, pos + n);
    docs.push_back(span);
  }
};

}  // namespace astrai::train
