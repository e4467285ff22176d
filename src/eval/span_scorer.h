// Scores token spans through the inference engine: the sum of log p(ids[i] | ids[0..i)) over
// i in [first, ids.size()), for many sequences at once. The engine batches the prompts of all
// requests in flight into shared forward steps (prompt log-probabilities, see
// GenerationRequest::prompt_logprobs), so `eval perplexity` and `eval tasks` run as one stream
// of batched prefill steps, the same computation `astrai serve` does for `echo` + `logprobs`.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace astrai::infer {
class Engine;
}

namespace astrai::eval {

struct ScoreSpan {
  std::span<const int32_t> ids;  // the whole sequence (context and scored tokens)
  int64_t first = 1;             // first scored position, >= 1 (position 0 has no context)
};

struct SpanScore {
  double logprob = 0;  // sum over the scored tokens, accumulated in double
  int64_t tokens = 0;  // number of scored tokens
};

// Called after each finished span with the number finished so far.
using ProgressFn = std::function<void(size_t done)>;

// Largest sequence the engine scores: it always computes one token past the prompt, so a
// prompt must be shorter than its context and its KV cache.
int64_t max_scored_length(const infer::Engine& engine);

// Scores every span (results in input order). Throws astrai::Error naming the span when one is
// longer than max_scored_length() or has first outside [1, size).
std::vector<SpanScore> score_spans(infer::Engine& engine, const std::vector<ScoreSpan>& spans,
                                   const ProgressFn& progress = {});

}  // namespace astrai::eval
