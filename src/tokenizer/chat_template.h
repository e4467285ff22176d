// Chat templates: render a conversation to the prompt text exactly as Hugging Face's
// `tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False,
// **kwargs)` does with Python jinja2 (see tokenizer/jinja/template.h for the semantics).
//
//   auto ct = ChatTemplate::from_tokenizer_config("model_dir");   // or .../tokenizer_config.json
//   std::string prompt = ct.render(messages, tools, /*add_generation_prompt=*/true,
//                                  {{"enable_thinking", false}});
//
// The template sees: messages, tools (None when absent), documents (None), add_generation_prompt,
// the special tokens of tokenizer_config.json (bos_token, eos_token, unk_token, pad_token, ... as
// strings; absent or null ones are undefined) and the extra kwargs, which override them.
//
// Pass JSON as nlohmann::ordered_json to keep the caller's key order: `tools | tojson` prints
// keys in the order the template receives them, as Python does.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/jinja/template.h"

namespace astrai::tokenizer {

class ChatTemplate {
 public:
  // A single template; special_tokens maps names (bos_token, eos_token, ...) to strings.
  explicit ChatTemplate(const std::string& source, std::map<std::string, std::string> special_tokens = {});

  // Reads `chat_template` (a string, or a list of {name, template}) and the special tokens from
  // tokenizer_config.json; `path` is that file, the directory holding it, or a GGUF model file
  // (tokenizer.chat_template in its metadata). Throws astrai::Error
  // when the file has no chat template or a template does not parse.
  static ChatTemplate from_tokenizer_config(const std::string& path);

  // HF's choice among named templates: an explicit `name`; else "tool_use" when tools are given
  // and it exists; else "default"; a single unnamed template is "default".
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools = nullptr,
                     bool add_generation_prompt = false,
                     const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object(),
                     const std::string& name = "") const;
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools, bool add_generation_prompt,
                     const nlohmann::json& kwargs = nlohmann::json::object(), const std::string& name = "") const;

  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  void set_special_token(const std::string& name, const std::string& value) { special_tokens_[name] = value; }
  // Template source by name ("default" for a single template).
  const std::string& source(const std::string& name = "default") const;
  bool has_template(const std::string& name) const { return templates_.count(name) != 0; }

 private:
  ChatTemplate() = default;
  struct Named {
    std::string source;
    std::shared_ptr<jinja::Template> compiled;
  };
  const Named& select(bool has_tools, const std::string& name) const;
  std::string render_values(const jinja::Value& messages, const jinja::Value& tools, bool add_generation_prompt,
                            const jinja::Value& kwargs, const std::string& name) const;

  std::map<std::string, Named> templates_;
  std::map<std::string, std::string> special_tokens_;
};

}  // namespace astrai::tokenizer
