// A request and its choices as the engine thread sees them. RequestState is shared with the
// submitting thread through RequestHandle: the only fields both sides touch are the cancel
// flag (atomic) and the final result (under mu).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "base/timer.h"
#include "infer/backend.h"
#include "infer/engine.h"
#include "infer/prefix_cache.h"
#include "infer/sampler.h"
#include "infer/text_stream.h"

namespace astrai::infer {

struct Sequence;

class RequestState {
 public:
  uint64_t id = 0;
  GenerationRequest request;  // prompt_ids resolved at submit
  StreamCallback on_delta;
  std::atomic<bool> cancel_requested{false};

  // Final result, published once under mu.
  mutable std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  GenerationResult result;

  // Engine-thread-only state.
  Timer clock;  // started at submit
  bool admitted_once = false;
  bool first_token_seen = false;
  bool forked = false;           // n > 1: the other choices were created
  int32_t live_sequences = 0;    // choices not finished yet
  int32_t max_len = 0;           // prompt + generated tokens a choice may reach
  std::vector<int32_t> stop_ids; // sorted
  GenerationResult pending;      // filled as choices finish
};

struct Sequence {
  RequestState* req = nullptr;
  int32_t choice = 0;
  uint64_t order = 0;  // admission priority: lower runs first, higher is preempted first
  std::vector<int32_t> tokens;  // prompt then generated
  int32_t prompt_len = 0;
  // KV entries written (tokens[0, num_computed) are in pages); the rest must be computed,
  // and the last token's logits are sampled when the computation reaches it.
  int32_t num_computed = 0;
  std::vector<int32_t> pages;
  ChainLink link;             // prefix-cache chain through the published pages
  int32_t published = 0;      // leading pages already published (or matched)
  bool prompt_logprobs_done = false;

  SamplerState sampler;
  std::unique_ptr<TokenDecoder> decoder;
  std::unique_ptr<TextStream> text;
  ChoiceResult result;
  bool finished = false;

  int32_t pending_tokens() const { return static_cast<int32_t>(tokens.size()) - num_computed; }
};

}  // namespace astrai::infer
