#include "serve/tool_recognizer.h"

#include "tokenizer/tool_calls.h"

namespace astrai::serve {

namespace {

// tokenizer::ToolCallStreamParser reports whole calls once their JSON is complete; each becomes
// a kToolStart plus one kToolArguments event (a valid, if coarse, way to stream arguments).
class ParserRecognizer : public ToolCallRecognizer {
 public:
  explicit ParserRecognizer(tokenizer::ToolCallFormat format) : parser_(format) {}

  void push(std::string_view text, std::vector<ChoiceEvent>* out) override { emit(parser_.feed(text), out); }
  void finish(std::vector<ChoiceEvent>* out) override { emit(parser_.finish(), out); }

 private:
  void emit(tokenizer::ToolCallParse parse, std::vector<ChoiceEvent>* out) {
    if (!parse.content.empty()) out->push_back({ChoiceEvent::Kind::kText, 0, std::move(parse.content), {}, {}});
    for (auto& call : parse.tool_calls) {
      out->push_back({ChoiceEvent::Kind::kToolStart, calls_, {}, std::move(call.id), std::move(call.name)});
      out->push_back({ChoiceEvent::Kind::kToolArguments, calls_, std::move(call.arguments), {}, {}});
      ++calls_;
    }
  }

  tokenizer::ToolCallStreamParser parser_;
  int calls_ = 0;
};

}  // namespace

ToolRecognizerFactory tool_recognizer_factory(const tokenizer::Tokenizer& tokenizer) {
  const tokenizer::ToolCallFormat format = tokenizer::detect_tool_call_format(tokenizer.chat_template());
  if (format == tokenizer::ToolCallFormat::kNone) return nullptr;
  return [format] { return std::make_unique<ParserRecognizer>(format); };
}

}  // namespace astrai::serve
