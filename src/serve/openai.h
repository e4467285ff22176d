// OpenAI protocol adapter: request JSON -> GenerationRequest, engine deltas -> exact wire
// bytes (chat.completion(.chunk), text_completion, SSE with "data: [DONE]").
// Pure functions and small state machines; no I/O, so every byte is unit-testable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"
#include "infer/engine.h"
#include "serve/choice_stream.h"
#include "serve/protocol_util.h"

namespace astrai::serve::openai {

struct ChatRequest {
  infer::GenerationRequest gen;  // messages and tools set; the server renders prompt_ids
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool tools_enabled = false;  // parse tool calls out of the output
};

// Throws ApiError (400 bad field, 404 unknown model).
ChatRequest parse_chat_request(const Json& body, const std::string& served_model);

struct CompletionRequest {
  infer::GenerationRequest gen;  // prompt_text or prompt_ids
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  int32_t logprobs = -1;  // -1 off, else number of alternatives (0..5)
  // max_tokens 0 (with echo): score the prompt only. The engine always samples at least one
  // token, so it runs with max_tokens 1 and that token is dropped from text, logprobs and usage.
  bool score_only = false;
};

CompletionRequest parse_completion_request(const Json& body, const std::string& served_model);

// Formats one chat completion. Streaming: start(), push() per delta, finish(). Not
// streaming: push() per delta (output ignored), then response().
class ChatWriter {
 public:
  ChatWriter(std::string id, std::string model, int64_t created, const ChatRequest& request,
             const ToolRecognizerFactory& tools, TokenBytesFn token_bytes);
  std::string start() const;  // the role delta of every choice
  std::string push(const infer::ChoiceDelta& delta);
  bool all_finished() const;
  std::string finish(const Usage& usage) const;  // usage chunk when asked, then [DONE]
  std::string error(const std::string& message) const;  // mid-stream failure, then [DONE]
  Json response(const Usage& usage) const;

 private:
  Json chunk(Json choices) const;
  Json logprobs_json(const std::vector<infer::TokenLogprob>& lps) const;
  std::string finish_reason(const ChoiceStream& c) const;

  std::string id_, model_;
  int64_t created_;
  bool include_usage_, logprobs_;
  TokenBytesFn token_bytes_;
  std::vector<ChoiceStream> choices_;
  std::vector<int> tool_calls_seen_;  // per choice: calls announced so far
};

class CompletionWriter {
 public:
  CompletionWriter(std::string id, std::string model, int64_t created, const CompletionRequest& request,
                   TokenBytesFn token_bytes);
  // Streaming: the echoed prompt (when echo) as the first chunk of every choice.
  std::string start(const std::vector<int32_t>& prompt_ids);
  std::string push(const infer::ChoiceDelta& delta);
  bool all_finished() const;
  std::string finish(const Usage& usage) const;
  std::string error(const std::string& message) const;
  // Not streaming: needs the result for the prompt's logprobs (echo).
  Json response(const infer::GenerationResult& result, const Usage& usage) const;
  bool score_only() const { return score_only_; }

 private:
  Json chunk(Json choices) const;
  // {"tokens","token_logprobs","top_logprobs","text_offset"} for these tokens, offsets from
  // `offset` (advanced).
  void append_logprobs(Json* lp, const std::vector<infer::TokenLogprob>& lps, bool first_has_no_context,
                       size_t* offset) const;

  std::string id_, model_;
  int64_t created_;
  bool include_usage_, echo_, score_only_;
  int32_t logprobs_;
  std::string prompt_text_;
  TokenBytesFn token_bytes_;
  std::vector<ChoiceStream> choices_;
  std::vector<size_t> stream_offsets_;
};

// The model list; max_model_len (the context length, vLLM's name) is left out when 0 (the
// engine is still loading).
Json models_response(const std::string& model, int64_t created, int32_t max_model_len);
Json model_json(const std::string& model, int64_t created, int32_t max_model_len);
Json usage_json(const Usage& usage);
// {"queue_ms","ttft_ms","decode_ms","decode_tokens","decode_tokens_per_second"}; ttft_ms and
// the rate are null when no token (or no token after the first) was generated.
Json timings_json(const Timings& timings);

}  // namespace astrai::serve::openai
