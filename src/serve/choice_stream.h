// One choice's output as protocol-neutral events: visible text, and tool calls recognised in
// the model's output (in the format its chat template teaches), also while streaming.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "infer/engine.h"

namespace astrai::serve {

struct ToolCall {
  std::string id;         // "call_..." (OpenAI) / "toolu_..." (Anthropic), made by the server
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

struct ChoiceEvent {
  enum class Kind { kText, kToolStart, kToolArguments };
  Kind kind = Kind::kText;
  int tool_index = 0;  // kToolStart / kToolArguments: index among this choice's calls
  std::string text;    // kText: content; kToolArguments: a fragment of the arguments JSON
  std::string id, name;  // kToolStart
};

// Streaming recogniser of tool calls in generated text. push() gets text as it comes and
// appends events; text that might still be the start of a call is held back.
class ToolCallRecognizer {
 public:
  virtual ~ToolCallRecognizer() = default;
  virtual void push(std::string_view text, std::vector<ChoiceEvent>* out) = 0;
  virtual void finish(std::vector<ChoiceEvent>* out) = 0;  // the choice ended: flush
};

using ToolRecognizerFactory = std::function<std::unique_ptr<ToolCallRecognizer>()>;

// Accumulates one choice: text, tool calls, token ids and logprobs, finish.
class ChoiceStream {
 public:
  // `recognizer` null: all output is text. `id_prefix` names generated tool-call ids.
  ChoiceStream(std::unique_ptr<ToolCallRecognizer> recognizer, std::string id_prefix);

  // Events this delta produces (its text through the recogniser; at the finish, flushed).
  std::vector<ChoiceEvent> push(const infer::ChoiceDelta& delta);

  const std::string& text() const { return text_; }
  const std::vector<ToolCall>& tool_calls() const { return calls_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  const std::vector<infer::TokenLogprob>& logprobs() const { return logprobs_; }
  bool finished() const { return finish_ != infer::FinishReason::kNone; }
  infer::FinishReason finish() const { return finish_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  void record(const std::vector<ChoiceEvent>& events);

  std::unique_ptr<ToolCallRecognizer> recognizer_;
  std::string id_prefix_;
  std::string text_;
  std::vector<ToolCall> calls_;
  std::vector<int32_t> token_ids_;
  std::vector<infer::TokenLogprob> logprobs_;
  infer::FinishReason finish_ = infer::FinishReason::kNone;
  std::string matched_stop_;
};

// A random id suffix ("call_" + 24 alphanumerics), unique enough for ids in one response.
std::string random_id(std::string_view prefix, size_t length = 24);

}  // namespace astrai::serve
