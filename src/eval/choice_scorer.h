// Where the log-likelihoods of `eval tasks` come from: the local inference engine, or an
// OpenAI-compatible server's /v1/completions (echo + logprobs, max_tokens 0). Both tokenize the
// same way (encode with the tokenizer's defaults; see context_and_continuation in tasks.h), so
// they give the same sums for the same model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "eval/span_scorer.h"
#include "eval/tasks.h"

namespace astrai::infer {
class Engine;
}

namespace astrai::eval {

class ChoiceScorer {
 public:
  virtual ~ChoiceScorer() = default;
  // scores[q][c]: the log-likelihood of choice c of question q. progress counts scored choices.
  virtual std::vector<std::vector<ChoiceScore>> score(const std::vector<Question>& questions,
                                                      const ProgressFn& progress) = 0;
};

// Through the engine's batched prompt scoring (span_scorer.h); the engine needs a tokenizer.
std::unique_ptr<ChoiceScorer> make_engine_choice_scorer(infer::Engine& engine);

struct ApiOptions {
  std::string url;      // http://HOST:PORT or .../v1 (posts to /v1/completions), or the endpoint URL
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
  int parallel = 8;     // requests in flight (the server batches them)
  double timeout_seconds = 600;
};

// Over HTTP: per question one request for the context's token count (usage.prompt_tokens of
// the context alone), and per choice one request with prompt = context + continuation,
// echo true, logprobs 0, max_tokens 0; the choice's sum is that of token_logprobs past the
// context's tokens.
std::unique_ptr<ChoiceScorer> make_api_choice_scorer(const ApiOptions& options);

}  // namespace astrai::eval
