#include "serve/anthropic.h"

#include <limits>

namespace astrai::serve::anthropic {

namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int32_t>::max();

std::string blocks_text(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError(400, where + ": content must be a string or an array of blocks");
  std::string out;
  for (const auto& b : content) {
    std::string type = b.is_object() ? b.value("type", "") : "";
    if (type != "text" || !b.contains("text") || !b["text"].is_string()) {
      throw ApiError(400, str_cat(where, ": block of type '", type, "' is not supported here (text only)"));
    }
    out += b["text"].get<std::string>();
  }
  return out;
}

Json convert_messages(const Json& body) {
  Json out = Json::array();
  if (auto it = body.find("system"); it != body.end() && !it->is_null()) {
    std::string system = blocks_text(*it, "system");
    if (!system.empty()) out.push_back({{"role", "system"}, {"content", system}});
  }
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) throw ApiError(400, "messages: must be a non-empty array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    std::string where = str_cat("messages.", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) throw ApiError(400, where + ": 'role' is required");
    std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant") {
      throw ApiError(400, str_cat(where, ".role: must be 'user' or 'assistant', got '", role, "'"));
    }
    if (!m.contains("content")) throw ApiError(400, where + ": 'content' is required");
    const Json& content = m["content"];
    if (content.is_string()) {
      out.push_back({{"role", role}, {"content", content}});
      continue;
    }
    if (!content.is_array()) throw ApiError(400, where + ".content: must be a string or an array of blocks");
    std::string text;
    Json calls = Json::array();
    for (size_t j = 0; j < content.size(); ++j) {
      const Json& b = content[j];
      std::string bwhere = str_cat(where, ".content.", j);
      std::string type = b.is_object() ? b.value("type", "") : "";
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string()) throw ApiError(400, bwhere + ".text: must be a string");
        text += b["text"].get<std::string>();
      } else if (type == "tool_use") {
        if (role != "assistant") throw ApiError(400, bwhere + ": tool_use blocks belong to assistant turns");
        if (!b.contains("name") || !b["name"].is_string()) throw ApiError(400, bwhere + ".name: required");
        Json input = b.contains("input") ? b["input"] : Json::object();
        calls.push_back({{"id", b.value("id", "")}, {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", input}}}});
      } else if (type == "tool_result") {
        if (role != "user") throw ApiError(400, bwhere + ": tool_result blocks belong to user turns");
        std::string result = b.contains("content") && !b["content"].is_null() ? blocks_text(b["content"], bwhere) : "";
        if (b.value("is_error", false)) result = "Error: " + result;
        out.push_back({{"role", "tool"}, {"tool_call_id", b.value("tool_use_id", "")}, {"content", result}});
      } else if (type == "thinking" || type == "redacted_thinking") {
        continue;  // earlier reasoning is not replayed into the prompt
      } else {
        throw ApiError(400, str_cat(bwhere, ": content block type '", type, "' is not supported"));
      }
    }
    if (!text.empty() || !calls.empty()) {
      Json msg = {{"role", role}, {"content", text}};
      if (!calls.empty()) msg["tool_calls"] = std::move(calls);
      out.push_back(std::move(msg));
    }
  }
  return out;
}

Json convert_tools(const Json& body) {
  Json tools = Json::array();
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return tools;
  if (!it->is_array()) throw ApiError(400, "tools: must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("input_schema")) {
      throw ApiError(400, str_cat("tools.", i, ": needs 'name' and 'input_schema' (server tools are not supported)"));
    }
    Json fn = {{"name", t["name"]}, {"parameters", t["input_schema"]}};
    if (t.contains("description")) fn["description"] = t["description"];
    tools.push_back({{"type", "function"}, {"function", fn}});
  }
  auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return tools;
  std::string type = choice->is_object() ? choice->value("type", "") : "";
  if (type == "none") return Json::array();
  if (type == "auto" || type == "any") return tools;
  if (type == "tool") {
    for (const auto& t : tools) {
      if (t["function"]["name"] == choice->value("name", "")) return Json::array({t});
    }
    throw ApiError(400, "tool_choice.name: not one of the tools");
  }
  throw ApiError(400, "tool_choice.type: must be auto, any, tool or none");
}

}  // namespace

MessagesRequest parse_messages_request(const Json& body, const std::string& served_model, bool count_tokens) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model(body, served_model, true);
  MessagesRequest r;
  r.gen.messages = convert_messages(body);
  Json tools = convert_tools(body);
  if (!tools.empty()) {
    r.gen.tools = tools;
    r.tools_enabled = true;
  }
  if (count_tokens) return r;
  auto max_tokens = opt_int(body, "max_tokens", 1, kNoLimit);
  if (!max_tokens) throw ApiError(400, "max_tokens: Field required", "max_tokens");
  auto& s = r.gen.sampling;
  s.max_tokens = static_cast<int32_t>(*max_tokens);
  s.temperature = static_cast<float>(opt_number(body, "temperature", 0, 1).value_or(1.0));
  s.top_p = static_cast<float>(opt_number(body, "top_p", 0, 1).value_or(1.0));
  s.top_k = static_cast<int32_t>(opt_int(body, "top_k", 0, kNoLimit).value_or(0));
  s.stop_strings = string_or_list(body, "stop_sequences", 16);
  r.stream = opt_bool(body, "stream").value_or(false);
  return r;
}

MessagesWriter::MessagesWriter(std::string id, std::string model, const MessagesRequest& request,
                               const ToolRecognizerFactory& tools)
    : id_(std::move(id)), model_(std::move(model)), choice_(request.tools_enabled && tools ? tools() : nullptr, "toolu_") {}

std::string MessagesWriter::start(int32_t input_tokens) const {
  return sse_event("message_start",
                   {{"type", "message_start"},
                    {"message",
                     {{"id", id_},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"model", model_},
                      {"content", Json::array()},
                      {"stop_reason", nullptr},
                      {"stop_sequence", nullptr},
                      {"usage", {{"input_tokens", input_tokens}, {"output_tokens", 0}}}}}});
}

std::string MessagesWriter::open_block(Json block) {
  std::string out = close_block();
  ++block_index_;
  block_open_ = true;
  out += sse_event("content_block_start",
                   {{"type", "content_block_start"}, {"index", block_index_}, {"content_block", std::move(block)}});
  if (!pinged_) {
    pinged_ = true;
    out += sse_event("ping", {{"type", "ping"}});
  }
  return out;
}

std::string MessagesWriter::close_block() {
  if (!block_open_) return {};
  block_open_ = false;
  open_tool_ = -1;
  return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
}

std::string MessagesWriter::push(const infer::ChoiceDelta& delta) {
  if (delta.index != 0 || choice_.finished()) return {};
  std::string out;
  for (const auto& e : choice_.push(delta)) {
    if (e.kind == ChoiceEvent::Kind::kText) {
      if (!block_open_ || !block_is_text_) {
        out += open_block({{"type", "text"}, {"text", ""}});
        block_is_text_ = true;
      }
      out += sse_event("content_block_delta", {{"type", "content_block_delta"},
                                               {"index", block_index_},
                                               {"delta", {{"type", "text_delta"}, {"text", e.text}}}});
    } else if (e.kind == ChoiceEvent::Kind::kToolStart) {
      out += open_block({{"type", "tool_use"}, {"id", e.id}, {"name", e.name}, {"input", Json::object()}});
      block_is_text_ = false;
      open_tool_ = e.tool_index;
    } else if (block_open_ && !block_is_text_ && e.tool_index == open_tool_) {
      out += sse_event("content_block_delta", {{"type", "content_block_delta"},
                                               {"index", block_index_},
                                               {"delta", {{"type", "input_json_delta"}, {"partial_json", e.text}}}});
    }
  }
  return out;
}

std::string MessagesWriter::stop_reason() const {
  if (!choice_.tool_calls().empty()) return "tool_use";
  switch (choice_.finish()) {
    case infer::FinishReason::kLength: return "max_tokens";
    case infer::FinishReason::kStopString: return "stop_sequence";
    default: return "end_turn";
  }
}

std::string MessagesWriter::finish(const Usage& usage) {
  std::string out;
  if (block_index_ < 0) {  // nothing was generated: still one (empty) text block, like the API
    out += open_block({{"type", "text"}, {"text", ""}});
    block_is_text_ = true;
  }
  out += close_block();
  std::string reason = stop_reason();
  Json stop_sequence = reason == "stop_sequence" ? Json(choice_.matched_stop()) : Json(nullptr);
  out += sse_event("message_delta",
                   {{"type", "message_delta"},
                    {"delta", {{"stop_reason", reason}, {"stop_sequence", stop_sequence}}},
                    {"usage", {{"input_tokens", usage.prompt_tokens}, {"output_tokens", usage.completion_tokens}}}});
  out += sse_event("message_stop", {{"type", "message_stop"}});
  return out;
}

std::string MessagesWriter::error(const std::string& message) const {
  return sse_event("error", error_json(Protocol::kAnthropic, 500, message));
}

Json MessagesWriter::response(const Usage& usage) const {
  Json content = Json::array();
  if (!choice_.text().empty() || choice_.tool_calls().empty()) {
    content.push_back({{"type", "text"}, {"text", choice_.text()}});
  }
  for (const auto& call : choice_.tool_calls()) {
    Json input = Json::parse(call.arguments, nullptr, false);
    if (input.is_discarded() || !input.is_object()) input = Json::object();
    content.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", input}});
  }
  std::string reason = stop_reason();
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", std::move(content)},
          {"stop_reason", reason},
          {"stop_sequence", reason == "stop_sequence" ? Json(choice_.matched_stop()) : Json(nullptr)},
          {"usage",
           {{"input_tokens", usage.prompt_tokens},
            {"output_tokens", usage.completion_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", 0}}}};
}

}  // namespace astrai::serve::anthropic
