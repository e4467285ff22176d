#include "tokenizer/tool_calls.h"

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace astrai::tokenizer {

namespace {

using OJson = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_ident(char c) { return is_alnum(c) || c == '_' || c == '-' || c == '.'; }

std::string_view marker_of(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return kHermesOpen;
    case ToolCallFormat::kMistral: return kMistralMarker;
    case ToolCallFormat::kLlama3Json: return kPythonTag;
    default: return {};
  }
}

// Length of the longest proper prefix of `marker` that `s` ends with.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

// True when s[pos..] is a proper prefix of `word` (more text could complete it).
bool is_partial(std::string_view s, size_t pos, std::string_view word) {
  std::string_view rest = s.substr(pos);
  return rest.size() < word.size() && word.substr(0, rest.size()) == rest;
}

// End (one past) of the JSON object/array starting at s[i] ('{' or '['), or npos if incomplete.
size_t json_end(std::string_view s, size_t i) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (size_t k = i; k < s.size(); ++k) {
    char c = s[k];
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return k + 1;
    }
  }
  return std::string::npos;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string dump_args(const OJson& args) {
  if (args.is_string()) return args.get<std::string>();
  return args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Qwen3-Coder / Qwen3.5 put XML inside <tool_call>:
//   <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...\n</function>
// Values that parse as JSON numbers, booleans, null, objects or arrays keep that type; anything
// else is a string (one newline on each side of the value belongs to the markup).
bool parse_xml_function(std::string_view s, OJson* call) {
  constexpr std::string_view kOpen = "<function=", kClose = "</function>", kParam = "<parameter=",
                             kParamClose = "</parameter>";
  if (s.substr(0, kOpen.size()) != kOpen) return false;
  size_t gt = s.find('>');
  if (gt == std::string_view::npos) return false;
  std::string name = trim(s.substr(kOpen.size(), gt - kOpen.size()));
  if (name.empty()) return false;
  OJson args = OJson::object();
  size_t pos = gt + 1;
  while (true) {
    while (pos < s.size() && is_ws(s[pos])) ++pos;
    if (s.substr(pos, kClose.size()) == kClose) {
      pos += kClose.size();
      break;
    }
    if (s.substr(pos, kParam.size()) != kParam) return false;
    size_t kgt = s.find('>', pos);
    size_t end = s.find(kParamClose, pos);
    if (kgt == std::string_view::npos || end == std::string_view::npos || end < kgt) return false;
    std::string key = trim(s.substr(pos + kParam.size(), kgt - pos - kParam.size()));
    std::string_view value = s.substr(kgt + 1, end - kgt - 1);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    OJson v = std::string(value);
    try {
      OJson parsed = OJson::parse(value);
      if (!parsed.is_string()) v = std::move(parsed);
    } catch (const nlohmann::json::exception&) {
    }
    args[key] = std::move(v);
    pos = end + kParamClose.size();
  }
  while (pos < s.size() && is_ws(s[pos])) ++pos;
  if (pos != s.size()) return false;
  *call = OJson{{"name", name}, {"arguments", std::move(args)}};
  return true;
}

}  // namespace

ToolCallFormat detect_tool_call_format(std::string_view t) {
  if (t.find(kMistralMarker) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (t.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (t.find(kPythonTag) != std::string_view::npos ||
      (t.find("<|start_header_id|>") != std::string_view::npos && t.find("parameters") != std::string_view::npos))
    return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    default: return "none";
  }
}

ToolCallFormat parse_tool_call_format(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  if (name == "none") return ToolCallFormat::kNone;
  fail("unknown tool call format '", std::string(name), "' (expected hermes, llama3_json, mistral or none)");
}

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, uint64_t id_seed)
    : format_(format), rng_(id_seed) {}

std::string ToolCallStreamParser::new_id() {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const bool mistral = format_ == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kChars[rng_() % 62];
  return id;
}

void ToolCallStreamParser::emit_content(std::string_view t, ToolCallParse& out) {
  if (t.empty()) return;
  if (skip_ws_) {
    size_t b = 0;
    while (b < t.size() && is_ws(t[b])) ++b;
    t = t.substr(b);
    if (t.empty()) return;
    skip_ws_ = false;
  }
  size_t e = t.size();
  while (e > 0 && is_ws(t[e - 1])) --e;
  if (e == 0) {
    held_ws_.append(t);
    return;
  }
  out.content += held_ws_;
  held_ws_.clear();
  out.content.append(t.substr(0, e));
  held_ws_.assign(t.substr(e));
}

bool ToolCallStreamParser::add_call_object(const void* p, ToolCallParse& out) {
  const OJson& obj = *static_cast<const OJson*>(p);
  if (!obj.is_object()) return false;
  const OJson* fn = &obj;
  // {"type": "function", "function": {"name": ..., "arguments": ...}} is accepted too.
  if (!obj.contains("name") && obj.contains("function") && obj["function"].is_object()) fn = &obj["function"];
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) return false;
  ToolCall call;
  call.name = name->get<std::string>();
  auto args = fn->find("arguments");
  if (args == fn->end()) args = fn->find("parameters");
  call.arguments = args == fn->end() || args->is_null() ? "{}" : dump_args(*args);
  auto id = obj.find("id");
  call.id = (id != obj.end() && id->is_string() && !id->get<std::string>().empty()) ? id->get<std::string>() : new_id();
  out.tool_calls.push_back(std::move(call));
  return true;
}

// A JSON object (one call) or array (Mistral: several); all or nothing.
bool ToolCallStreamParser::add_call(const std::string& text, ToolCallParse& out) {
  OJson j;
  if (format_ == ToolCallFormat::kHermes && text.rfind("<function=", 0) == 0) {
    if (!parse_xml_function(text, &j)) return false;
  } else {
    try {
      j = OJson::parse(text);
    } catch (const nlohmann::json::exception&) {
      return false;
    }
  }
  ToolCallParse tmp;
  if (j.is_array()) {
    if (j.empty()) return false;
    for (const auto& e : j)
      if (!add_call_object(&e, tmp)) return false;
  } else if (!add_call_object(&j, tmp)) {
    return false;
  }
  for (auto& c : tmp.tool_calls) out.tool_calls.push_back(std::move(c));
  any_call_ = true;
  skip_ws_ = true;
  held_ws_.clear();
  return true;
}

void ToolCallStreamParser::process(bool final, ToolCallParse& out) {
  const std::string_view marker = marker_of(format_);
  // Payload that turned out not to be a tool call goes back to content, with the whitespace that
  // preceded its marker.
  auto fail_payload = [&](std::string_view rest) {
    std::string raw = payload_raw_ + std::string(rest);
    payload_raw_.clear();
    state_ = State::kText;
    emit_content(raw, out);
  };
  while (true) {
    switch (state_) {
      case State::kText: {
        if (format_ == ToolCallFormat::kLlama3Json && at_start_) {
          size_t i = 0;
          while (i < buf_.size() && is_ws(buf_[i])) ++i;
          if (i == buf_.size()) {
            if (final) {
              emit_content(buf_, out);
              buf_.clear();
            }
            return;
          }
          at_start_ = false;
          if (buf_[i] == '{') {
            state_ = State::kLeadingJson;
            continue;
          }
        }
        size_t p = buf_.find(marker);
        if (p != std::string::npos) {
          emit_content(std::string_view(buf_).substr(0, p), out);
          payload_raw_ = held_ws_ + std::string(marker);
          held_ws_.clear();
          buf_.erase(0, p + marker.size());
          state_ = format_ == ToolCallFormat::kHermes ? State::kHermesCall : State::kPayload;
          payload_calls_ = 0;
          continue;
        }
        size_t hold = final ? 0 : partial_suffix(buf_, marker);
        emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), out);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case State::kHermesCall: {
        size_t p = buf_.find(kHermesClose);
        if (p == std::string::npos) {
          if (!final) return;
          // Unterminated (generation stopped): a complete JSON call still counts.
          if (add_call(trim(buf_), out)) {
            payload_raw_.clear();
            state_ = State::kText;
          } else {
            fail_payload(buf_);
          }
          buf_.clear();
          return;
        }
        std::string body = buf_.substr(0, p);
        buf_.erase(0, p + kHermesClose.size());
        if (add_call(trim(body), out)) {
          payload_raw_.clear();
          state_ = State::kText;
        } else {
          fail_payload(body + std::string(kHermesClose));
        }
        continue;
      }
      case State::kPayload: {
        const bool llama = format_ == ToolCallFormat::kLlama3Json;
        size_t i = 0;
        while (i < buf_.size() && (is_ws(buf_[i]) || (llama && buf_[i] == ';') || (!llama && buf_[i] == ','))) ++i;
        if (i == buf_.size()) {
          if (!final) return;
          if (payload_calls_ == 0) {
            fail_payload(buf_);
          } else {
            state_ = State::kText;
          }
          buf_.clear();
          return;
        }
        if (!llama && buf_.compare(i, kMistralMarker.size(), kMistralMarker) == 0) {
          payload_raw_ += buf_.substr(0, i + kMistralMarker.size());
          buf_.erase(0, i + kMistralMarker.size());
          continue;
        }
        if (!llama && !final && is_partial(buf_, i, kMistralMarker)) return;
        char c = buf_[i];
        if (c == '{' || c == '[') {
          size_t end = json_end(buf_, i);
          if (end == std::string::npos) {
            if (!final) return;
            fail_payload(buf_);
            buf_.clear();
            return;
          }
          if (add_call(buf_.substr(i, end - i), out)) {
            ++payload_calls_;
            payload_raw_.clear();
            buf_.erase(0, end);
          } else {
            std::string rest = buf_;
            buf_.clear();
            if (payload_calls_ == 0) {
              fail_payload(rest);
            } else {
              state_ = State::kText;
              emit_content(rest, out);
            }
          }
          continue;
        }
        if (!llama && is_ident(c)) {
          // Mistral v11+: name[ARGS]{...} or name[CALL_ID]id[ARGS]{...}
          size_t j = i;
          while (j < buf_.size() && is_ident(buf_[j])) ++j;
          auto wait_or_fail = [&]() {
            if (final) {
              std::string rest = buf_;
              buf_.clear();
              fail_payload(rest);
            }
          };
          if (j == buf_.size()) {
            wait_or_fail();
            return;
          }
          std::string name = buf_.substr(i, j - i), id;
          size_t k = j;
          if (buf_.compare(k, kMistralCallId.size(), kMistralCallId) == 0) {
            k += kMistralCallId.size();
            size_t m = k;
            while (m < buf_.size() && is_alnum(buf_[m])) ++m;
            if (m == buf_.size()) {
              wait_or_fail();
              return;
            }
            id = buf_.substr(k, m - k);
            k = m;
          } else if (is_partial(buf_, k, kMistralCallId) && !final) {
            return;
          }
          if (buf_.compare(k, kMistralArgs.size(), kMistralArgs) != 0) {
            if (is_partial(buf_, k, kMistralArgs) && !final) return;
            std::string rest = buf_;
            buf_.clear();
            if (payload_calls_ == 0) fail_payload(rest); else { state_ = State::kText; emit_content(rest, out); }
            continue;
          }
          k += kMistralArgs.size();
          while (k < buf_.size() && is_ws(buf_[k])) ++k;
          size_t end = k < buf_.size() && buf_[k] == '{' ? json_end(buf_, k) : std::string::npos;
          if (end == std::string::npos) {
            if (k < buf_.size() && buf_[k] != '{') {
              std::string rest = buf_;
              buf_.clear();
              fail_payload(rest);
              continue;
            }
            wait_or_fail();
            return;
          }
          OJson call = OJson::object();
          call["name"] = name;
          try {
            call["arguments"] = OJson::parse(buf_.substr(k, end - k));
          } catch (const nlohmann::json::exception&) {
            std::string rest = buf_;
            buf_.clear();
            fail_payload(rest);
            continue;
          }
          if (!id.empty()) call["id"] = id;
          add_call(call.dump(), out);
          ++payload_calls_;
          payload_raw_.clear();
          buf_.erase(0, end);
          continue;
        }
        // Plain text after the calls.
        std::string rest = buf_;
        buf_.clear();
        if (payload_calls_ == 0) {
          fail_payload(rest);
        } else {
          state_ = State::kText;
          buf_ = rest;
        }
        continue;
      }
      case State::kLeadingJson: {
        size_t i = 0;
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
        size_t end = json_end(buf_, i);
        if (end == std::string::npos) {
          if (!final) return;
          emit_content(buf_, out);
          buf_.clear();
          state_ = State::kText;
          return;
        }
        // Only {"name": ..., "parameters"|"arguments": ...} is a call; other JSON is content.
        bool is_call = false;
        try {
          OJson j = OJson::parse(buf_.substr(i, end - i));
          is_call = j.is_object() && j.contains("name") && (j.contains("parameters") || j.contains("arguments"));
        } catch (const nlohmann::json::exception&) {
        }
        if (is_call && add_call(buf_.substr(i, end - i), out)) {
          buf_.erase(0, end);
          payload_raw_.clear();
          payload_calls_ = 1;
          state_ = State::kPayload;
        } else {
          emit_content(std::string_view(buf_).substr(0, end), out);
          buf_.erase(0, end);
          state_ = State::kText;
        }
        continue;
      }
    }
  }
}

ToolCallParse ToolCallStreamParser::feed(std::string_view delta) {
  if (finished_) fail("tool call parser: feed() after finish()");
  ToolCallParse out;
  if (format_ == ToolCallFormat::kNone) {
    out.content.assign(delta);
    return out;
  }
  buf_.append(delta);
  process(false, out);
  return out;
}

ToolCallParse ToolCallStreamParser::finish() {
  if (finished_) fail("tool call parser: finish() called twice");
  finished_ = true;
  ToolCallParse out;
  if (format_ == ToolCallFormat::kNone) return out;
  process(true, out);
  if (!any_call_) out.content += held_ws_;
  held_ws_.clear();
  return out;
}

ToolCallParse parse_tool_calls(std::string_view text, ToolCallFormat format, uint64_t id_seed) {
  ToolCallStreamParser p(format, id_seed);
  ToolCallParse out = p.feed(text);
  ToolCallParse tail = p.finish();
  out.content += tail.content;
  for (auto& c : tail.tool_calls) out.tool_calls.push_back(std::move(c));
  return out;
}

}  // namespace astrai::tokenizer
