// Picks the tool-call format the served model's chat template teaches and makes streaming
// recognisers for it (adapting tokenizer/tool_calls.h to the server's ChoiceEvents).
#pragma once

#include "serve/choice_stream.h"
#include "tokenizer/tokenizer.h"

namespace astrai::serve {

// Null when the template teaches no tool-call format: tool calls then stay plain text.
ToolRecognizerFactory tool_recognizer_factory(const tokenizer::Tokenizer& tokenizer);

}  // namespace astrai::serve
