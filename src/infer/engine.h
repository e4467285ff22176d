// The public inference API, used alike by `astrai generate`/`chat`, the HTTP server and
// GRPO rollouts. Thread-safe: any thread may submit and cancel; one engine thread runs the
// steps (one forward pass over a packed ragged batch per step).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"
#include "model/forward_profile.h"
#include "tensor/dtype.h"

namespace astrai::model {
class Transformer;
}
namespace astrai::tokenizer {
class Tokenizer;
}

namespace astrai::infer {

class ForwardBackend;  // infer/backend.h
class TextCodec;

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;  // same seed => same output, whatever else is batched
  int32_t logprobs = -1;         // -1 off; 0 chosen token only; N chosen + top N
  int32_t max_tokens = 256;      // clamped to the context; finish reason kLength
  std::vector<int32_t> stop_token_ids;  // added to EOS and the template's end-of-turn ids
  bool ignore_eos = false;
  std::vector<std::string> stop_strings;  // matched on decoded text, never emitted
  int32_t n = 1;                          // choices sharing the prompt's pages
};

// Exactly one prompt form is used: prompt_ids if non-empty, else messages if non-null
// (rendered with the model's chat template, with `tools`), else prompt_text.
struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;
  Json messages;  // OpenAI-style [{role, content, ...}]
  Json tools;     // passed to the chat template as `tools`
  bool add_generation_prompt = true;
  Json template_kwargs;        // extra template variables, e.g. {"enable_thinking": false}
  bool truncate_left = false;  // over-long prompts: keep the newest tokens instead of failing
  bool prompt_logprobs = false;  // logprob of every prompt token given its prefix (echo/scoring)
  SamplingParams sampling;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // best alternatives, highest first
};

enum class FinishReason { kNone, kStop, kStopString, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "stop", "length", "cancelled", "error"

// Streamed piece of one choice. `text` is safe to show: whole UTF-8 characters only, and
// text that could still become a stop string is held back until it cannot.
struct ChoiceDelta {
  int32_t index = 0;
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::kNone;  // set on the last delta of the choice
  std::string matched_stop;                   // the stop string, when finish == kStopString
};

struct ChoiceResult {
  int32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;  // generated ids, prompt excluded
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string matched_stop;
};

struct GenerationResult {
  std::vector<ChoiceResult> choices;
  std::vector<int32_t> prompt_ids;         // after templating and truncation
  std::vector<TokenLogprob> prompt_logprobs;  // when asked; entry 0 has no context
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  std::string error;                 // non-empty when the request failed
  double queue_seconds = 0, first_token_seconds = 0, total_seconds = 0;
};

// Called on the engine thread for every delta; keep it short and non-blocking.
using StreamCallback = std::function<void(const ChoiceDelta&)>;

class RequestState;

class RequestHandle {
 public:
  explicit RequestHandle(std::shared_ptr<RequestState> state) : state_(std::move(state)) {}
  uint64_t id() const;
  bool done() const;
  GenerationResult wait() const;  // blocks until finished, cancelled or failed
  const std::shared_ptr<RequestState>& state() const { return state_; }

 private:
  std::shared_ptr<RequestState> state_;
};

struct EngineOptions {
  int32_t max_running = 64;          // cap on requests in the running batch
  int32_t max_queue = 1024;          // submit() beyond this throws QueueFullError
  int32_t max_step_tokens = 2048;    // token budget of one step (chunked prefill)
  int32_t page_size = 16;
  int64_t kv_cache_bytes = 512ll << 20;
  // K/V element type: "f32", "bf16" (half the memory and the bytes each decode step reads;
  // K/V rounded to bf16 when written, so logits move by about bf16's precision), or "auto":
  // bf16 for a bf16 checkpoint, f32 otherwise.
  std::string kv_dtype = "auto";
  bool prefix_cache = true;
  // Fault the KV cache's host memory in at start (commits kv_cache_bytes; the first requests
  // then pay no page faults for it: about a tenth of a 512-token prefill on a fresh pool).
  bool prefault_kv = false;
  int32_t max_context = 0;           // 0 = the model's max_position_embeddings
  // Where tokens are drawn: "host" (the engine's sampler over logits copied to the host),
  // "device" (next to the logits, by the model's backend: backend/sampling.h; only the tokens
  // and their logprobs come back), or "auto": the host for now (sampling on a GPU has not run
  // on one yet; docs/inference.md). Rows with logit bias or penalties, prompt logprobs, or n > 1
  // choices about to fork are always sampled on the host. Both give the same tokens and logprobs.
  std::string sample_on = "auto";
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  uint64_t requests_total = 0;
  uint64_t tokens_generated = 0;
  uint64_t prompt_tokens_total = 0;
  uint64_t prefix_cache_hit_tokens = 0;
  int32_t kv_pages_total = 0;
  int32_t kv_pages_used = 0;   // referenced by at least one request
  int32_t kv_pages_free = 0;   // free list + cached (evictable)
  int32_t kv_pages_cached = 0; // unreferenced, held by the prefix cache
  double prefix_cache_hit_rate = 0;  // hit tokens / prompt tokens
  uint64_t steps = 0;
  uint64_t preemptions = 0;
  // Where the engine thread's time went (seconds since start): building the step (scheduling,
  // packing), the forward pass, and sampling, detokenizing and delivering deltas.
  double schedule_seconds = 0;
  double forward_seconds = 0;
  double sample_seconds = 0;
  // The forward's time per operation (attention, each projection, ...) since start, if the
  // model measures it (the transformer does: two clock reads per operation).
  model::ForwardProfile forward_profile;
  uint64_t step_tokens_total = 0;  // tokens computed by all forwards
};

class QueueFullError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  Engine(std::shared_ptr<const model::Transformer> model, std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
         EngineOptions options);
  // Any model behind the ForwardBackend interface (tests, other devices). `codec` may be null:
  // then requests are token ids in, token ids out (no text, stop strings or chat messages).
  Engine(std::unique_ptr<ForwardBackend> backend, std::unique_ptr<TextCodec> codec, EngineOptions options);
  ~Engine();  // stops the engine thread; unfinished requests end as kCancelled
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues; throws astrai::Error for a bad request (e.g. prompt too long
  // without truncate_left) and QueueFullError when the queue is full.
  RequestHandle submit(GenerationRequest request, StreamCallback on_delta = {});
  void cancel(const RequestHandle& handle);  // honoured before the next step; pages return
  EngineStats stats() const;
  // Whether submit() would take a request now: not shutting down and the queue has room (the
  // readiness a load balancer asks for).
  bool accepting_requests() const;
  // Weights changed (e.g. an optimizer step): drop prefix-cache entries of older versions.
  void invalidate_prefix_cache(uint64_t new_weights_version);
  // Stops accepting requests; running ones finish (or are cancelled after grace_seconds).
  void shutdown(double grace_seconds = 30.0);

  // Renders messages with the chat template and tokenizes (what submit() would use).
  std::vector<int32_t> render_prompt(const GenerationRequest& request) const;
  const tokenizer::Tokenizer& tokenizer() const;  // throws if built without one
  const model::Transformer& model() const;
  // Context length requests are checked against, and KV capacity in tokens.
  int32_t max_context() const;
  int32_t kv_capacity_tokens() const;
  DType kv_dtype() const;  // what "auto" resolved to

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace astrai::infer
