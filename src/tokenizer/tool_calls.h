// Tool calls in model output, in the formats chat templates teach:
//   Hermes / Qwen:  text <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call> ...
//                   (Qwen3-Coder / Qwen3.5 XML inside the block: <function=f><parameter=k>v</parameter>
//                   </function>)
//   Llama-3 JSON:   {"name": "f", "parameters": {...}}   (whole reply; or after <|python_tag|>,
//                   several separated by ';')
//   Mistral:        text [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "a1b2c3d4e"}]
//                   or the v11+ form [TOOL_CALLS]f[ARGS]{...} (optionally f[CALL_ID]id[ARGS]{...})
// Parsing returns the plain content plus the calls, each with an id (the model's when it gives
// one, else a fresh one: "call_" + 24 alphanumerics, or 9 alphanumerics for Mistral, whose
// templates require that) and its arguments as a JSON object text.
//
// Content rules (the same for whole-text and streaming parsing, which share one implementation):
// text outside tool calls is content; whitespace that touches a tool call is dropped; a block that
// looks like a tool call but does not parse (bad JSON, no name) is kept verbatim as content.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace astrai::tokenizer {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral };

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

struct ToolCallParse {
  std::string content;
  std::vector<ToolCall> tool_calls;
};

// The format a chat template teaches, from its source: [TOOL_CALLS] → Mistral, <tool_call> →
// Hermes, <|python_tag|> or a Llama-3 header with "parameters" → Llama-3 JSON; else kNone.
ToolCallFormat detect_tool_call_format(std::string_view chat_template);
const char* tool_call_format_name(ToolCallFormat format);
// "hermes" | "llama3_json" | "mistral" | "none"; throws astrai::Error for anything else.
ToolCallFormat parse_tool_call_format(std::string_view name);

// Incremental parser: feed() text deltas as they are generated; each call returns the content
// that is now certain to be plain text (text that may still turn out to be the start of a tool
// call, and trailing whitespace, are held back) and the tool calls completed so far. finish()
// flushes at the end of generation. kNone passes text through unchanged.
class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ToolCallFormat format, uint64_t id_seed = std::random_device{}());
  ToolCallParse feed(std::string_view delta);
  ToolCallParse finish();
  bool saw_tool_call() const { return any_call_; }

 private:
  enum class State { kText, kHermesCall, kPayload, kLeadingJson };
  void process(bool final, ToolCallParse& out);
  void emit_content(std::string_view text, ToolCallParse& out);
  bool add_call(const std::string& json_text, ToolCallParse& out);
  bool add_call_object(const void* json_object, ToolCallParse& out);
  std::string new_id();

  ToolCallFormat format_;
  State state_ = State::kText;
  std::string buf_;
  std::string held_ws_;        // trailing whitespace of emitted content, dropped if a call follows
  std::string payload_raw_;    // payload text consumed so far (to restore it as content on failure)
  bool at_start_ = true;       // nothing but whitespace seen (Llama-3 JSON replies start with '{')
  bool skip_ws_ = false;       // drop whitespace right after a tool call
  bool any_call_ = false;
  bool finished_ = false;
  int payload_calls_ = 0;      // calls parsed since the last marker
  std::mt19937_64 rng_;
};

// Parses a complete reply (same rules as streaming it in one piece).
ToolCallParse parse_tool_calls(std::string_view text, ToolCallFormat format,
                               uint64_t id_seed = std::random_device{}());

}  // namespace astrai::tokenizer
