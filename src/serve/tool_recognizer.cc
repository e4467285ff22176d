#include "serve/tool_recognizer.h"

namespace astrai::serve {

ToolRecognizerFactory tool_recognizer_factory(const tokenizer::Tokenizer& tokenizer) {
  // Wired to tokenizer/tool_calls.h once it lands; until then tool calls stay text.
  (void)tokenizer;
  return nullptr;
}

}  // namespace astrai::serve
