#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/gguf_file.h"
#include "tokenizer/gguf_vocab.h"

namespace astrai::tokenizer {

namespace {

const char* const kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

// A special token in tokenizer_config.json is a string or an AddedToken object {content: ...}.
bool token_string(const nlohmann::ordered_json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    *out = v["content"].get<std::string>();
    return true;
  }
  return false;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::map<std::string, std::string> special_tokens)
    : special_tokens_(std::move(special_tokens)) {
  templates_["default"] = Named{source, std::make_shared<jinja::Template>(source)};
}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = fs::is_directory(path) ? fs::path(path) / "tokenizer_config.json" : fs::path(path);
  nlohmann::ordered_json cfg;
  if (is_gguf_file(path)) {  // a GGUF model file: tokenizer.chat_template in its metadata
    const Json meta = read_gguf(path).metadata;
    cfg = nlohmann::ordered_json::parse(gguf_tokenizer_config(meta, path).dump(-1, ' ', false, Json::error_handler_t::replace));
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) fail("chat template: cannot open ", file.string());
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      cfg = nlohmann::ordered_json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      fail("chat template: ", file.string(), ": invalid JSON: ", e.what());
    }
  }
  if (!cfg.is_object()) fail("chat template: ", file.string(), ": expected a JSON object");
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) fail("chat template: ", file.string(), " has no \"chat_template\"");

  ChatTemplate ct;
  auto add = [&](const std::string& name, const std::string& source) {
    try {
      ct.templates_[name] = Named{source, std::make_shared<jinja::Template>(source)};
    } catch (const Error& e) {
      fail("chat template '", name, "' in ", file.string(), ": ", e.what());
    }
  };
  if (it->is_string()) {
    add("default", it->get<std::string>());
  } else if (it->is_array()) {
    for (const auto& t : *it) {
      if (!t.is_object() || !t.contains("name") || !t.contains("template") || !t["name"].is_string() ||
          !t["template"].is_string())
        fail("chat template: ", file.string(), ": chat_template list entries need string name and template");
      add(t["name"].get<std::string>(), t["template"].get<std::string>());
    }
  } else {
    fail("chat template: ", file.string(), ": chat_template must be a string or a list");
  }
  for (const char* name : kSpecialTokenNames) {
    auto st = cfg.find(name);
    std::string value;
    if (st != cfg.end() && token_string(*st, &value)) ct.special_tokens_[name] = value;
  }
  return ct;
}

const std::string& ChatTemplate::source(const std::string& name) const {
  auto it = templates_.find(name);
  if (it == templates_.end()) fail("chat template: no template named '", name, "'");
  return it->second.source;
}

const ChatTemplate::Named& ChatTemplate::select(bool has_tools, const std::string& name) const {
  if (!name.empty()) {
    auto it = templates_.find(name);
    if (it == templates_.end()) fail("chat template: no template named '", name, "'");
    return it->second;
  }
  if (has_tools) {
    auto it = templates_.find("tool_use");
    if (it != templates_.end()) return it->second;
  }
  auto it = templates_.find("default");
  if (it != templates_.end()) return it->second;
  std::string names;
  for (const auto& [n, t] : templates_) names += (names.empty() ? "" : ", ") + n;
  fail("chat template: several templates (", names, ") and none is named 'default'; pass a name");
}

std::string ChatTemplate::render_values(const jinja::Value& messages, const jinja::Value& tools,
                                        bool add_generation_prompt, const jinja::Value& kwargs,
                                        const std::string& name) const {
  if (!messages.is_list()) fail("chat template: messages must be a list");
  const Named& t = select(!tools.is_none() && !tools.is_undefined(), name);
  jinja::Value ctx = jinja::Value::dict();
  auto& d = ctx.dict_mut();
  d.set("messages", messages);
  d.set("tools", tools.is_undefined() ? jinja::Value::none() : tools);
  d.set("documents", jinja::Value::none());
  d.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  for (const auto& [k, v] : special_tokens_) d.set(k, jinja::Value(v));
  if (kwargs.is_dict()) {
    for (const auto& [k, v] : kwargs.dict_ref().items()) d.set(k, v);
  } else if (!kwargs.is_none() && !kwargs.is_undefined()) {
    fail("chat template: extra kwargs must be a JSON object");
  }
  return t.compiled->render(ctx);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& kwargs,
                                 const std::string& name) const {
  return render_values(jinja::Value::from_json(messages), jinja::Value::from_json(tools), add_generation_prompt,
                       jinja::Value::from_json(kwargs), name);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& kwargs,
                                 const std::string& name) const {
  return render_values(jinja::Value::from_json(messages), jinja::Value::from_json(tools), add_generation_prompt,
                       jinja::Value::from_json(kwargs), name);
}

}  // namespace astrai::tokenizer
