// What Ops::sample takes and gives: one token drawn from one row of logits on the backend's
// device, so only the token (and its logprobs) leave the device. The rules are the engine's
// sampler's (infer/sampler.h) for rows without logit bias or penalties: greedy at temperature 0,
// else temperature, top-k, min-p and top-p over exp((logit - max) / temperature) and one draw at
// `uniform`; logprobs are those of the raw logits. backend/sample_rows.h is the algorithm.
#pragma once

#include <cstdint>

#include "base/error.h"

namespace astrai::backend {

// The most alternatives a row reports (the API's top_logprobs limit).
constexpr int32_t kMaxTopLogprobs = 20;

struct SampleSpec {
  int64_t row = 0;            // which row of the logits
  float temperature = 1.0f;   // 0: greedy (lowest id among equal maxima)
  int32_t top_k = 0;          // 0: off
  float top_p = 1.0f;         // 1: off
  float min_p = 0.0f;         // 0: off
  int32_t top_logprobs = -1;  // -1: no logprobs; else the chosen token's and this many alternatives
  double uniform = 0.0;       // in [0, 1): the draw (unused at temperature 0)
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;  // log-softmax of the raw logits at token (top_logprobs >= 0)
  int32_t num_top = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};  // best first; equal logits by lower id
  float top_logprobs[kMaxTopLogprobs] = {};
};

// Throws astrai::Error naming the first spec Ops::sample cannot take.
inline void check_sample_specs(const SampleSpec* specs, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i) {
    const SampleSpec& s = specs[i];
    ASTRAI_CHECK(s.row >= 0 && s.row < rows, "sample: row ", s.row, " outside the ", rows, " rows of logits");
    ASTRAI_CHECK(s.temperature >= 0.0f, "sample: temperature ", s.temperature, " < 0");
    ASTRAI_CHECK(s.top_k >= 0 && s.top_p > 0.0f && s.top_p <= 1.0f && s.min_p >= 0.0f && s.min_p <= 1.0f,
                 "sample: top_k, top_p or min_p out of range");
    ASTRAI_CHECK(s.top_logprobs >= -1 && s.top_logprobs <= kMaxTopLogprobs, "sample: top_logprobs ",
                 s.top_logprobs, " outside [-1, ", kMaxTopLogprobs, "]");
    ASTRAI_CHECK(s.uniform >= 0.0 && s.uniform < 1.0, "sample: uniform ", s.uniform, " outside [0, 1)");
  }
}

}  // namespace astrai::backend
