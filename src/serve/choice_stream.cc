#include "serve/choice_stream.h"

#include <random>

namespace astrai::serve {

std::string random_id(std::string_view prefix, size_t length) {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out(prefix);
  for (size_t i = 0; i < length; ++i) out += kChars[rng() % (sizeof kChars - 1)];
  return out;
}

ChoiceStream::ChoiceStream(std::unique_ptr<ToolCallRecognizer> recognizer, std::string id_prefix)
    : recognizer_(std::move(recognizer)), id_prefix_(std::move(id_prefix)) {}

std::vector<ChoiceEvent> ChoiceStream::push(const infer::ChoiceDelta& delta) {
  std::vector<ChoiceEvent> events;
  if (finished()) return events;  // nothing follows a finish
  token_ids_.insert(token_ids_.end(), delta.token_ids.begin(), delta.token_ids.end());
  logprobs_.insert(logprobs_.end(), delta.logprobs.begin(), delta.logprobs.end());
  if (recognizer_) {
    if (!delta.text.empty()) recognizer_->push(delta.text, &events);
    if (delta.finish != infer::FinishReason::kNone) recognizer_->finish(&events);
  } else if (!delta.text.empty()) {
    events.push_back({ChoiceEvent::Kind::kText, 0, delta.text, {}, {}});
  }
  for (auto& e : events) {
    if (e.kind == ChoiceEvent::Kind::kToolStart && e.id.empty()) e.id = random_id(id_prefix_);
  }
  record(events);
  if (delta.finish != infer::FinishReason::kNone) {
    finish_ = delta.finish;
    matched_stop_ = delta.matched_stop;
  }
  return events;
}

void ChoiceStream::record(const std::vector<ChoiceEvent>& events) {
  for (const auto& e : events) {
    switch (e.kind) {
      case ChoiceEvent::Kind::kText:
        text_ += e.text;
        break;
      case ChoiceEvent::Kind::kToolStart:
        if (static_cast<size_t>(e.tool_index) >= calls_.size()) calls_.resize(static_cast<size_t>(e.tool_index) + 1);
        calls_[static_cast<size_t>(e.tool_index)].id = e.id;
        calls_[static_cast<size_t>(e.tool_index)].name = e.name;
        break;
      case ChoiceEvent::Kind::kToolArguments:
        if (static_cast<size_t>(e.tool_index) < calls_.size()) calls_[static_cast<size_t>(e.tool_index)].arguments += e.text;
        break;
    }
  }
}

}  // namespace astrai::serve
