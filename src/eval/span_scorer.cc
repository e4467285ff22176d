#include "eval/span_scorer.h"

#include <algorithm>
#include <deque>

#include "base/error.h"
#include "infer/engine.h"

namespace astrai::eval {

namespace {

void check_span(const ScoreSpan& s, size_t index, int64_t limit) {
  const auto n = static_cast<int64_t>(s.ids.size());
  ASTRAI_CHECK(s.first >= 1 && s.first < n, "span ", index, ": first scored position ", s.first,
               " is outside [1, ", n, ")");
  ASTRAI_CHECK(n <= limit, "span ", index, " has ", n, " tokens but the engine scores at most ", limit,
               " (the model's context or the KV cache, less the one token the engine always computes next)");
}

infer::GenerationRequest scoring_request(const ScoreSpan& s) {
  infer::GenerationRequest r;
  r.prompt_ids.assign(s.ids.begin(), s.ids.end());
  r.prompt_logprobs = true;
  r.sampling.temperature = 0;  // the one generated token is discarded; greedy needs no seed
  r.sampling.max_tokens = 1;
  r.sampling.ignore_eos = true;
  return r;
}

SpanScore sum_scored(const infer::GenerationResult& res, int64_t first, size_t index) {
  if (!res.error.empty()) fail("span ", index, ": ", res.error);
  SpanScore out;
  for (size_t i = static_cast<size_t>(first); i < res.prompt_logprobs.size(); ++i) {
    out.logprob += static_cast<double>(res.prompt_logprobs[i].logprob);
    ++out.tokens;
  }
  return out;
}

}  // namespace

int64_t max_scored_length(const infer::Engine& engine) {
  return std::min<int64_t>(engine.max_context(), engine.kv_capacity_tokens()) - 1;
}

std::vector<SpanScore> score_spans(infer::Engine& engine, const std::vector<ScoreSpan>& spans,
                                   const ProgressFn& progress) {
  const int64_t limit = max_scored_length(engine);
  for (size_t i = 0; i < spans.size(); ++i) check_span(spans[i], i, limit);
  // Enough requests in flight to fill the engine's steps; bounded so results never pile up.
  const size_t window = 256;
  std::vector<SpanScore> out(spans.size());
  std::deque<std::pair<size_t, infer::RequestHandle>> in_flight;
  size_t next = 0, done = 0;
  while (done < spans.size()) {
    while (next < spans.size() && in_flight.size() < window) {
      in_flight.emplace_back(next, engine.submit(scoring_request(spans[next])));
      ++next;
    }
    auto [index, handle] = std::move(in_flight.front());
    in_flight.pop_front();
    out[index] = sum_scored(handle.wait(), spans[index].first, index);
    ++done;
    if (progress) progress(done);
  }
  return out;
}

}  // namespace astrai::eval
