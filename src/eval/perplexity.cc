#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace astrai::eval {

void check_window_options(int64_t context, int64_t stride) {
  ASTRAI_CHECK(context >= 2, "--context must be at least 2 (one token of context and one to score), got ", context);
  ASTRAI_CHECK(stride >= 1, "--stride must be at least 1, got ", stride);
  ASTRAI_CHECK(stride <= context, "--stride ", stride, " is larger than --context ", context,
               ": the tokens between windows would never be scored");
}

std::vector<Window> sliding_windows(int64_t num_tokens, int64_t context, int64_t stride) {
  check_window_options(context, stride);
  ASTRAI_CHECK(num_tokens >= 2, "the data has ", num_tokens, " token(s); perplexity needs at least 2");
  std::vector<Window> out;
  int64_t scored_until = 1;  // the first token has no context and is never scored
  for (int64_t begin = 0;; begin += stride) {
    const int64_t end = std::min(begin + context, num_tokens);
    const int64_t first = std::max(scored_until, begin + 1);  // a window's first token has no context
    if (end > first) out.push_back({begin, end, first});
    scored_until = std::max(scored_until, end);
    if (end == num_tokens) break;
  }
  return out;
}

double PerplexityResult::nll_per_token() const {
  return scored_tokens > 0 ? nll / static_cast<double>(scored_tokens) : 0.0;
}
double PerplexityResult::perplexity() const { return std::exp(nll_per_token()); }
double PerplexityResult::bits_per_byte() const {
  return scored_bytes > 0 ? nll / std::numbers::ln2 / static_cast<double>(scored_bytes) : 0.0;
}
double PerplexityResult::byte_perplexity() const {
  return scored_bytes > 0 ? std::exp(nll / static_cast<double>(scored_bytes)) : 0.0;
}

Json PerplexityResult::to_json() const {
  return Json{{"tokens", tokens},
              {"windows", windows},
              {"context", context},
              {"stride", stride},
              {"scored_tokens", scored_tokens},
              {"scored_bytes", scored_bytes},
              {"nll", nll},
              {"nll_per_token", nll_per_token()},
              {"perplexity", perplexity()},
              {"bits_per_byte", scored_bytes > 0 ? Json(bits_per_byte()) : Json(nullptr)},
              {"byte_perplexity", scored_bytes > 0 ? Json(byte_perplexity()) : Json(nullptr)},
              {"seconds", seconds}};
}

}  // namespace astrai::eval
