// Perplexity over one token stream with the usual sliding-window recipe (as in Hugging Face's
// "Perplexity of fixed-length models"): windows of `context` tokens start every `stride`
// tokens; each window scores only the tokens no earlier window scored, the rest of the window
// being their context. With stride < context every token but the stream's first is scored
// exactly once; with stride == context (windows that do not overlap) the first token of each
// window has no context and is not scored, as in that recipe.
#pragma once

#include <cstdint>
#include <vector>

#include "base/json.h"

namespace astrai::eval {

struct Window {
  int64_t begin = 0;  // tokens [begin, end) are the model's input
  int64_t end = 0;
  int64_t first = 0;  // tokens [first, end) are scored (first > begin)
};

// Throws astrai::Error when context < 2, stride < 1 or stride > context (tokens between
// windows would go unscored).
void check_window_options(int64_t context, int64_t stride);

// The windows over num_tokens tokens (check_window_options, and num_tokens >= 2).
std::vector<Window> sliding_windows(int64_t num_tokens, int64_t context, int64_t stride);

struct PerplexityResult {
  int64_t tokens = 0;         // tokens in the stream
  int64_t windows = 0;
  int64_t context = 0, stride = 0;
  int64_t scored_tokens = 0;  // sum over the windows of end - first
  int64_t scored_bytes = 0;   // UTF-8 bytes the scored tokens decode to (see token_stream.h)
  double nll = 0;             // sum of -log p over the scored tokens (nats)
  double seconds = 0;

  double nll_per_token() const;
  double perplexity() const;      // exp(nll / scored_tokens)
  double bits_per_byte() const;   // nll / ln 2 / scored_bytes (0 without bytes)
  double byte_perplexity() const; // exp(nll / scored_bytes) = 2^bits_per_byte (0 without bytes)
  Json to_json() const;           // the per-byte figures null when no scored token is text
};

}  // namespace astrai::eval
