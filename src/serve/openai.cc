#include "serve/openai.h"

#include <cmath>
#include <limits>

namespace astrai::serve::openai {

namespace {

constexpr int32_t kMaxChoices = 16;
constexpr int64_t kNoLimit = std::numeric_limits<int32_t>::max();

// OpenAI content: a string, null, or an array of parts of which we take the text ones.
std::string content_text(const Json& content, const std::string& where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string out;
    for (const auto& part : content) {
      if (part.is_string()) {
        out += part.get<std::string>();
        continue;
      }
      std::string type = part.is_object() ? part.value("type", "") : "";
      if (type != "text" || !part.contains("text") || !part["text"].is_string()) {
        throw ApiError(400, str_cat(where, ": content part of type '", type, "' is not supported (text only)"),
                       "messages");
      }
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw ApiError(400, str_cat(where, ": 'content' must be a string or an array of content parts"), "messages");
}

// Arguments arrive as a JSON string; templates want the object (`arguments | tojson`).
Json parse_arguments(const Json& args) {
  if (args.is_string()) {
    Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
    if (!parsed.is_discarded()) return parsed;
  }
  return args;
}

Json convert_messages(const Json& body) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    throw ApiError(400, "'messages' must be a non-empty array", "messages");
  }
  Json out = Json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    std::string where = str_cat("messages[", i, "]");
    if (!m.is_object()) throw ApiError(400, where + " must be an object", "messages");
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) throw ApiError(400, where + ": 'role' is required", "messages");
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      throw ApiError(400, str_cat(where, ": unknown role '", role, "'"), "messages");
    }
    Json msg = {{"role", role}};
    const Json content = m.contains("content") ? m["content"] : Json(nullptr);
    bool has_calls = m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty();
    if (content.is_null() && !(role == "assistant" && has_calls)) {
      throw ApiError(400, where + ": 'content' is required", "messages");
    }
    msg["content"] = content_text(content, where);
    if (m.contains("name") && m["name"].is_string()) msg["name"] = m["name"];
    if (role == "assistant" && has_calls) {
      Json calls = Json::array();
      for (const auto& call : m["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string()) {
          throw ApiError(400, where + ": each tool call needs function.name", "messages");
        }
        const Json& fn = call["function"];
        Json c = {{"type", "function"},
                  {"function", {{"name", fn["name"]}, {"arguments", parse_arguments(fn.value("arguments", Json("{}")))}}}};
        if (call.contains("id")) c["id"] = call["id"];
        calls.push_back(std::move(c));
      }
      msg["tool_calls"] = std::move(calls);
    }
    if (role == "tool") {
      if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) msg["tool_call_id"] = m["tool_call_id"];
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// OpenAI tools + tool_choice -> the list the template sees (empty: no tools).
Json convert_tools(const Json& body) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return Json::array();
  if (!it->is_array()) throw ApiError(400, "'tools' must be an array", "tools");
  Json tools = Json::array();
  for (const auto& t : *it) {
    if (!t.is_object() || t.value("type", "function") != "function" || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string()) {
      throw ApiError(400, "each tool must be {\"type\":\"function\",\"function\":{\"name\":...}}", "tools");
    }
    Json fn = t["function"];
    if (!fn.contains("parameters")) fn["parameters"] = {{"type", "object"}, {"properties", Json::object()}};
    tools.push_back({{"type", "function"}, {"function", fn}});
  }
  auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return tools;
  if (choice->is_string()) {
    std::string c = choice->get<std::string>();
    if (c == "none") return Json::array();
    if (c == "auto" || c == "required") return tools;
    throw ApiError(400, "'tool_choice' must be none, auto, required or a named function", "tool_choice");
  }
  if (choice->is_object() && choice->contains("function") && (*choice)["function"].contains("name")) {
    const Json& name = (*choice)["function"]["name"];
    for (const auto& t : tools) {
      if (t["function"]["name"] == name) return Json::array({t});
    }
    throw ApiError(400, str_cat("'tool_choice' names a function not in 'tools': ", name.dump()), "tool_choice");
  }
  throw ApiError(400, "'tool_choice' must be none, auto, required or a named function", "tool_choice");
}

// Sampling fields common to chat and completions.
void parse_sampling(const Json& body, infer::SamplingParams* s, int64_t default_max_tokens) {
  s->temperature = static_cast<float>(opt_number(body, "temperature", 0, 2).value_or(1.0));
  s->top_p = static_cast<float>(opt_number(body, "top_p", 0, 1).value_or(1.0));
  int64_t top_k = opt_int(body, "top_k", -1, kNoLimit).value_or(0);
  s->top_k = static_cast<int32_t>(top_k < 0 ? 0 : top_k);
  s->min_p = static_cast<float>(opt_number(body, "min_p", 0, 1).value_or(0.0));
  s->presence_penalty = static_cast<float>(opt_number(body, "presence_penalty", -2, 2).value_or(0.0));
  s->frequency_penalty = static_cast<float>(opt_number(body, "frequency_penalty", -2, 2).value_or(0.0));
  s->repetition_penalty = static_cast<float>(opt_number(body, "repetition_penalty", 0.01, 100).value_or(1.0));
  if (auto seed = opt_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    s->seed = static_cast<uint64_t>(*seed);
  }
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw ApiError(400, "'logit_bias' must map token ids to numbers", "logit_bias");
    for (const auto& [key, value] : it->items()) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
      }
      if (id < 0 || id > kNoLimit || !value.is_number() || value.get<double>() < -100 || value.get<double>() > 100) {
        throw ApiError(400, str_cat("'logit_bias' entry \"", key, "\" must be a token id with a bias in [-100, 100]"),
                       "logit_bias");
      }
      s->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(value.get<double>()));
    }
  }
  s->stop_strings = string_or_list(body, "stop", 16);
  if (auto it = body.find("stop_token_ids"); it != body.end() && it->is_array()) {
    for (const auto& id : *it) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) throw ApiError(400, "'stop_token_ids' must be token ids", "stop_token_ids");
      s->stop_token_ids.push_back(id.get<int32_t>());
    }
  }
  s->ignore_eos = opt_bool(body, "ignore_eos").value_or(false);
  s->n = static_cast<int32_t>(opt_int(body, "n", 1, kMaxChoices).value_or(1));
  if (auto best_of = opt_int(body, "best_of", 1, kMaxChoices); best_of && *best_of != s->n) {
    throw ApiError(400, "'best_of' different from 'n' is not supported", "best_of");
  }
  s->max_tokens = static_cast<int32_t>(default_max_tokens);
}

void parse_stream(const Json& body, bool* stream, bool* include_usage) {
  *stream = opt_bool(body, "stream").value_or(false);
  auto it = body.find("stream_options");
  if (it != body.end() && !it->is_null()) {
    if (!*stream) throw ApiError(400, "'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (!it->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    *include_usage = opt_bool(*it, "include_usage").value_or(false);
  }
}

Json token_entry(const std::string& bytes, float logprob) {
  Json b = Json::array();
  for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
  return {{"token", utf8_lossy(bytes)}, {"logprob", logprob}, {"bytes", std::move(b)}};
}

// One streamed chunk; with include_usage every chunk but the last carries "usage": null.
Json stream_chunk(const char* object, const std::string& id, int64_t created, const std::string& model,
                  bool include_usage, Json choices) {
  Json j = {{"id", id},
            {"object", object},
            {"created", created},
            {"model", model},
            {"system_fingerprint", nullptr},
            {"choices", std::move(choices)}};
  if (include_usage) j["usage"] = nullptr;
  return j;
}

bool all_choices_finished(const std::vector<ChoiceStream>& choices) {
  for (const auto& c : choices) {
    if (!c.finished()) return false;
  }
  return true;
}

// The end of an OpenAI stream: the usage chunk (an empty choices array), when asked, then [DONE].
std::string end_of_stream(bool include_usage, Json empty_chunk, const Usage& usage) {
  std::string out;
  if (include_usage) {
    empty_chunk["usage"] = usage_json(usage);
    if (usage.timings) empty_chunk["timings"] = timings_json(*usage.timings);
    out += sse_data(empty_chunk);
  }
  out += "data: [DONE]\n\n";
  return out;
}

// A failure after the stream started: an error event, then [DONE].
std::string stream_error(const std::string& message) {
  return sse_data(error_json(Protocol::kOpenAi, 500, message)) + "data: [DONE]\n\n";
}

}  // namespace

ChatRequest parse_chat_request(const Json& body, const std::string& served_model) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model(body, served_model, false);
  ChatRequest r;
  r.gen.messages = convert_messages(body);
  Json tools = convert_tools(body);
  if (!tools.empty()) {
    r.gen.tools = tools;
    r.tools_enabled = true;
  }
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    std::string type = it->is_object() ? it->value("type", "") : "";
    if (type != "text") {
      throw ApiError(400, str_cat("'response_format' of type '", type,
                                  "' is not supported yet (no constrained decoding); use \"text\""),
                     "response_format");
    }
  }
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && it->is_object()) r.gen.template_kwargs = *it;
  parse_sampling(body, &r.gen.sampling, kNoLimit);
  auto max_tokens = opt_int(body, "max_tokens", 1, kNoLimit);
  auto max_completion = opt_int(body, "max_completion_tokens", 1, kNoLimit);
  if (max_completion) max_tokens = max_completion;
  if (max_tokens) r.gen.sampling.max_tokens = static_cast<int32_t>(*max_tokens);
  r.logprobs = opt_bool(body, "logprobs").value_or(false);
  auto top = opt_int(body, "top_logprobs", 0, 20);
  if (top && !r.logprobs) throw ApiError(400, "'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
  r.top_logprobs = static_cast<int32_t>(top.value_or(0));
  r.gen.sampling.logprobs = r.logprobs ? r.top_logprobs : -1;
  parse_stream(body, &r.stream, &r.include_usage);
  return r;
}

CompletionRequest parse_completion_request(const Json& body, const std::string& served_model) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model(body, served_model, false);
  CompletionRequest r;
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
  const Json* prompt = &*it;
  // A list holding one prompt (string or token ids) is the same prompt; batches are not served.
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    prompt = &(*prompt)[0];
  }
  if (prompt->is_string()) {
    r.gen.prompt_text = prompt->get<std::string>();
    if (r.gen.prompt_text.empty()) throw ApiError(400, "'prompt' must not be empty", "prompt");
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const auto& id : *prompt) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kNoLimit) {
        throw ApiError(400, "'prompt' must be a string, token ids, or a list of one of those", "prompt");
      }
      r.gen.prompt_ids.push_back(id.get<int32_t>());
    }
  } else {
    throw ApiError(400, "'prompt' must be a string or token ids (one prompt per request)", "prompt");
  }
  if (body.contains("suffix") && !body["suffix"].is_null()) throw ApiError(400, "'suffix' is not supported", "suffix");
  parse_sampling(body, &r.gen.sampling, 16);
  r.echo = opt_bool(body, "echo").value_or(false);
  // max_tokens 0 with echo scores the prompt only (log-likelihood harnesses).
  if (auto max_tokens = opt_int(body, "max_tokens", r.echo ? 0 : 1, kNoLimit)) {
    r.gen.sampling.max_tokens = static_cast<int32_t>(*max_tokens);
  }
  if (r.gen.sampling.max_tokens == 0) {
    r.score_only = true;
    r.gen.sampling.max_tokens = 1;
  }
  r.logprobs = static_cast<int32_t>(opt_int(body, "logprobs", 0, 20).value_or(-1));
  r.gen.sampling.logprobs = r.logprobs;
  r.gen.prompt_logprobs = r.echo && r.logprobs >= 0;
  parse_stream(body, &r.stream, &r.include_usage);
  if (r.stream && r.gen.prompt_logprobs) {
    throw ApiError(400, "'echo' with 'logprobs' is only supported without 'stream'", "stream");
  }
  return r;
}

Json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {
double round_ms(double ms) { return std::round(ms * 1000.0) / 1000.0; }
}  // namespace

Json timings_json(const Timings& t) {
  // The rate from the decode span as reported (rounded), so that the fields agree with each other.
  const double decode_ms = round_ms(t.decode_ms);
  Json rate = nullptr;
  if (decode_ms > 0 && t.decode_tokens > 0) rate = round_ms(t.decode_tokens / (decode_ms / 1000.0));
  return {{"queue_ms", round_ms(t.queue_ms)},
          {"ttft_ms", t.ttft_ms < 0 ? Json(nullptr) : Json(round_ms(t.ttft_ms))},
          {"decode_ms", decode_ms},
          {"decode_tokens", t.decode_tokens},
          {"decode_tokens_per_second", rate}};
}

namespace {
// A whole (non-streamed) response: its choices, usage, and the server's timings when measured.
Json response_json(const std::string& id, const char* object, int64_t created, const std::string& model,
                   Json choices, const Usage& usage) {
  Json j = {{"id", id},
            {"object", object},
            {"created", created},
            {"model", model},
            {"system_fingerprint", nullptr},
            {"choices", std::move(choices)},
            {"usage", usage_json(usage)}};
  if (usage.timings) j["timings"] = timings_json(*usage.timings);
  return j;
}
}  // namespace

Json model_json(const std::string& model, int64_t created, int32_t max_model_len) {
  Json j = {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "astrai"}};
  if (max_model_len > 0) j["max_model_len"] = max_model_len;
  return j;
}

Json models_response(const std::string& model, int64_t created, int32_t max_model_len) {
  return {{"object", "list"}, {"data", Json::array({model_json(model, created, max_model_len)})}};
}

// ---------------------------------------------------------------------------------------
// Chat

ChatWriter::ChatWriter(std::string id, std::string model, int64_t created, const ChatRequest& request,
                       const ToolRecognizerFactory& tools, TokenBytesFn token_bytes)
    : id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      include_usage_(request.include_usage),
      logprobs_(request.logprobs),
      token_bytes_(std::move(token_bytes)) {
  for (int32_t i = 0; i < request.gen.sampling.n; ++i) {
    choices_.emplace_back(request.tools_enabled && tools ? tools() : nullptr, "call_");
  }
  tool_calls_seen_.assign(choices_.size(), 0);
}

Json ChatWriter::chunk(Json choices) const {
  return stream_chunk("chat.completion.chunk", id_, created_, model_, include_usage_, std::move(choices));
}

Json ChatWriter::logprobs_json(const std::vector<infer::TokenLogprob>& lps) const {
  Json content = Json::array();
  for (const auto& lp : lps) {
    Json e = token_entry(token_bytes_(lp.id), lp.logprob);
    Json top = Json::array();
    for (const auto& [id, value] : lp.top) top.push_back(token_entry(token_bytes_(id), value));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

std::string ChatWriter::finish_reason(const ChoiceStream& c) const {
  if (!c.tool_calls().empty()) return "tool_calls";
  if (c.finish() == infer::FinishReason::kLength) return "length";
  return "stop";
}

std::string ChatWriter::start() const {
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    out += sse_data(chunk(Json::array({{{"index", i},
                                        {"delta", {{"role", "assistant"}, {"content", ""}}},
                                        {"logprobs", nullptr},
                                        {"finish_reason", nullptr}}})));
  }
  return out;
}

std::string ChatWriter::push(const infer::ChoiceDelta& delta) {
  if (delta.index < 0 || static_cast<size_t>(delta.index) >= choices_.size()) return {};
  ChoiceStream& c = choices_[static_cast<size_t>(delta.index)];
  if (c.finished()) return {};
  std::vector<ChoiceEvent> events = c.push(delta);
  std::string text;
  Json calls = Json::array();
  for (const auto& e : events) {
    if (e.kind == ChoiceEvent::Kind::kText) {
      text += e.text;
    } else if (e.kind == ChoiceEvent::Kind::kToolStart) {
      calls.push_back({{"index", e.tool_index},
                       {"id", e.id},
                       {"type", "function"},
                       {"function", {{"name", e.name}, {"arguments", ""}}}});
    } else {
      calls.push_back({{"index", e.tool_index}, {"function", {{"arguments", e.text}}}});
    }
  }
  std::string out;
  bool has_logprobs = logprobs_ && !delta.logprobs.empty();
  if (!text.empty() || !calls.empty() || has_logprobs) {
    Json d = Json::object();
    if (!text.empty() || (calls.empty() && has_logprobs)) d["content"] = text;
    if (!calls.empty()) d["tool_calls"] = std::move(calls);
    out += sse_data(chunk(Json::array({{{"index", delta.index},
                                        {"delta", std::move(d)},
                                        {"logprobs", has_logprobs ? logprobs_json(delta.logprobs) : Json(nullptr)},
                                        {"finish_reason", nullptr}}})));
  }
  if (c.finished()) {
    out += sse_data(chunk(Json::array({{{"index", delta.index},
                                        {"delta", Json::object()},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason(c)}}})));
  }
  return out;
}

bool ChatWriter::all_finished() const { return all_choices_finished(choices_); }

std::string ChatWriter::finish(const Usage& usage) const {
  return end_of_stream(include_usage_, chunk(Json::array()), usage);
}

std::string ChatWriter::error(const std::string& message) const { return stream_error(message); }

Json ChatWriter::response(const Usage& usage) const {
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const ChoiceStream& c = choices_[i];
    Json message = {{"role", "assistant"}, {"content", c.text()}, {"refusal", nullptr}};
    if (!c.tool_calls().empty()) {
      Json calls = Json::array();
      for (const auto& call : c.tool_calls()) {
        calls.push_back(
            {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      }
      message["tool_calls"] = std::move(calls);
      if (c.text().empty()) message["content"] = nullptr;
    }
    choices.push_back({{"index", i},
                       {"message", std::move(message)},
                       {"logprobs", logprobs_ ? logprobs_json(c.logprobs()) : Json(nullptr)},
                       {"finish_reason", finish_reason(c)}});
  }
  return response_json(id_, "chat.completion", created_, model_, std::move(choices), usage);
}

// ---------------------------------------------------------------------------------------
// Completions

CompletionWriter::CompletionWriter(std::string id, std::string model, int64_t created,
                                   const CompletionRequest& request, TokenBytesFn token_bytes)
    : id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      include_usage_(request.include_usage),
      echo_(request.echo),
      score_only_(request.score_only),
      logprobs_(request.logprobs),
      token_bytes_(std::move(token_bytes)) {
  for (int32_t i = 0; i < request.gen.sampling.n; ++i) choices_.emplace_back(nullptr, "");
  stream_offsets_.assign(choices_.size(), 0);
}

Json CompletionWriter::chunk(Json choices) const {
  return stream_chunk("text_completion", id_, created_, model_, include_usage_, std::move(choices));
}

void CompletionWriter::append_logprobs(Json* lp, const std::vector<infer::TokenLogprob>& lps,
                                       bool first_has_no_context, size_t* offset) const {
  for (size_t i = 0; i < lps.size(); ++i) {
    std::string text = utf8_lossy(token_bytes_(lps[i].id));
    (*lp)["tokens"].push_back(text);
    (*lp)["text_offset"].push_back(*offset);
    *offset += text.size();
    if (i == 0 && first_has_no_context) {
      (*lp)["token_logprobs"].push_back(nullptr);
      (*lp)["top_logprobs"].push_back(nullptr);
      continue;
    }
    (*lp)["token_logprobs"].push_back(lps[i].logprob);
    Json top = Json::object();
    for (const auto& [id, value] : lps[i].top) top[utf8_lossy(token_bytes_(id))] = value;
    (*lp)["top_logprobs"].push_back(std::move(top));
  }
}

namespace {
Json empty_logprobs() {
  return {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
          {"text_offset", Json::array()}};
}

const char* completion_finish(infer::FinishReason r) { return r == infer::FinishReason::kLength ? "length" : "stop"; }
}  // namespace

std::string CompletionWriter::start(const std::vector<int32_t>& prompt_ids) {
  if (!echo_) return {};
  std::string bytes;
  for (int32_t id : prompt_ids) bytes += token_bytes_(id);
  std::string text = utf8_lossy(bytes);
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    out += sse_data(chunk(Json::array({{{"index", i}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}})));
  }
  // Offsets of streamed logprobs continue after the echoed prompt.
  stream_offsets_.assign(choices_.size(), text.size());
  return out;
}

std::string CompletionWriter::push(const infer::ChoiceDelta& delta) {
  if (delta.index < 0 || static_cast<size_t>(delta.index) >= choices_.size()) return {};
  ChoiceStream& c = choices_[static_cast<size_t>(delta.index)];
  if (c.finished()) return {};
  std::vector<ChoiceEvent> events = c.push(delta);
  std::string text;
  if (!score_only_) {
    for (const auto& e : events) text += e.text;
  }
  bool has_logprobs = logprobs_ >= 0 && !delta.logprobs.empty() && !score_only_;
  if (text.empty() && !has_logprobs && !c.finished()) return {};
  Json lp = nullptr;
  if (has_logprobs) {
    lp = empty_logprobs();
    append_logprobs(&lp, delta.logprobs, false, &stream_offsets_[static_cast<size_t>(delta.index)]);
  }
  return sse_data(chunk(Json::array({{{"index", delta.index},
                                      {"text", text},
                                      {"logprobs", std::move(lp)},
                                      {"finish_reason", c.finished() ? Json(score_only_ ? "length" : completion_finish(c.finish()))
                                                                     : Json(nullptr)}}})));
}

bool CompletionWriter::all_finished() const { return all_choices_finished(choices_); }

std::string CompletionWriter::finish(const Usage& usage) const {
  return end_of_stream(include_usage_, chunk(Json::array()), usage);
}

std::string CompletionWriter::error(const std::string& message) const { return stream_error(message); }

Json CompletionWriter::response(const infer::GenerationResult& result, const Usage& usage) const {
  std::string prompt_text;
  if (echo_) {
    std::string bytes;
    for (int32_t id : result.prompt_ids) bytes += token_bytes_(id);
    prompt_text = utf8_lossy(bytes);
  }
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const ChoiceStream& c = choices_[i];
    Json lp = nullptr;
    if (logprobs_ >= 0) {
      lp = empty_logprobs();
      size_t offset = 0;
      if (echo_) append_logprobs(&lp, result.prompt_logprobs, true, &offset);
      if (!score_only_) append_logprobs(&lp, c.logprobs(), false, &offset);
    }
    choices.push_back({{"index", i},
                       {"text", score_only_ ? prompt_text : prompt_text + c.text()},
                       {"logprobs", std::move(lp)},
                       {"finish_reason", score_only_ ? "length" : completion_finish(c.finish())}});
  }
  return response_json(id_, "text_completion", created_, model_, std::move(choices), usage);
}

}  // namespace astrai::serve::openai
