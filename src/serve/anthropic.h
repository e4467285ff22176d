// Anthropic Messages protocol adapter: request JSON -> GenerationRequest (system, content
// blocks, tool_use / tool_result turned into the chat template's messages and tools), engine
// deltas -> the exact SSE event sequence (message_start, content_block_start, ping,
// content_block_delta, content_block_stop, message_delta, message_stop).
#pragma once

#include <cstdint>
#include <string>

#include "base/json.h"
#include "infer/engine.h"
#include "serve/choice_stream.h"
#include "serve/protocol_util.h"

namespace astrai::serve::anthropic {

struct MessagesRequest {
  infer::GenerationRequest gen;  // messages (OpenAI form, what templates read) and tools
  bool stream = false;
  bool tools_enabled = false;
};

// count_tokens: the same body without max_tokens / sampling. Throws ApiError.
MessagesRequest parse_messages_request(const Json& body, const std::string& served_model, bool count_tokens = false);

class MessagesWriter {
 public:
  MessagesWriter(std::string id, std::string model, const MessagesRequest& request, const ToolRecognizerFactory& tools);
  std::string start(int32_t input_tokens) const;  // message_start
  std::string push(const infer::ChoiceDelta& delta);
  bool finished() const { return choice_.finished(); }
  std::string finish(const Usage& usage);  // closes the open block, message_delta, message_stop
  std::string error(const std::string& message) const;
  Json response(const Usage& usage) const;

 private:
  std::string open_block(Json block);
  std::string close_block();
  std::string stop_reason() const;

  std::string id_, model_;
  ChoiceStream choice_;
  int block_index_ = -1;           // index of the open (or last) block
  bool block_open_ = false;
  bool block_is_text_ = false;
  int open_tool_ = -1;             // tool index of the open tool_use block
  bool pinged_ = false;
};

}  // namespace astrai::serve::anthropic
