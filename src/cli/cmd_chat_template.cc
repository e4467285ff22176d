// `astrai chat-template`: renders a conversation with a model's chat template, byte for byte what
// Hugging Face's apply_chat_template(..., tokenize=False) gives. Reads tokenizer_config.json
// itself (no vocabulary needed), or a bare .jinja file with --template.
//
//   astrai chat-template --tokenizer DIR --messages m.json [--tools t.json] [--add-generation-prompt]
//                        [--kwargs '{"enable_thinking": false}']
//   astrai chat-template --template t.jinja --batch cases.jsonl   (one JSON result per line)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "base/error.h"
#include "cli/command.h"
#include "tokenizer/chat_template.h"

namespace astrai::cli {

namespace {

using OJson = nlohmann::ordered_json;

struct ChatTemplateOptions {
  std::string tokenizer;
  std::string template_file;
  std::string messages;
  std::string tools;
  std::string kwargs;
  std::string batch;
  std::string name;
  std::string bos_token;
  std::string eos_token;
  bool add_generation_prompt = false;
  bool has_bos = false;
  bool has_eos = false;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

OJson parse_json(const std::string& text, const std::string& where) {
  // Deeply nested input would overflow the stack in recursive JSON copies; refuse it early.
  auto limit_depth = [&](int depth, OJson::parse_event_t, OJson&) {
    if (depth > 512) fail(where, ": JSON nested deeper than 512 levels");
    return true;
  };
  try {
    return OJson::parse(text, limit_depth);
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": invalid JSON: ", e.what());
  }
}

// --messages accepts a list of messages or an object with "messages" (and optionally "tools").
void load_conversation(const OJson& j, const std::string& where, OJson* messages, OJson* tools) {
  if (j.is_array()) {
    *messages = j;
  } else if (j.is_object() && j.contains("messages")) {
    *messages = j["messages"];
    if (j.contains("tools") && tools->is_null()) *tools = j["tools"];
  } else {
    fail(where, ": expected a list of messages or an object with \"messages\"");
  }
}

void run_chat_template(const ChatTemplateOptions& o) {
  if (o.tokenizer.empty() == o.template_file.empty()) fail("chat-template: give exactly one of --tokenizer or --template");
  std::unique_ptr<tokenizer::ChatTemplate> ct;
  if (!o.tokenizer.empty()) {
    ct = std::make_unique<tokenizer::ChatTemplate>(tokenizer::ChatTemplate::from_tokenizer_config(o.tokenizer));
  } else {
    ct = std::make_unique<tokenizer::ChatTemplate>(read_file(o.template_file));
  }
  if (o.has_bos) ct->set_special_token("bos_token", o.bos_token);
  if (o.has_eos) ct->set_special_token("eos_token", o.eos_token);

  if (!o.batch.empty()) {
    // One case per line: {"messages": [...], "tools": [...]?, "add_generation_prompt": bool?,
    // "kwargs": {...}?}; prints {"text": ...} or {"error": ...} per case.
    std::ifstream in(o.batch);
    if (!in) fail("cannot open ", o.batch);
    std::string line;
    size_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.empty()) continue;
      OJson c = parse_json(line, o.batch + " line " + std::to_string(n));
      OJson result = OJson::object();
      try {
        OJson messages, tools;
        load_conversation(c, o.batch, &messages, &tools);
        bool agp = c.value("add_generation_prompt", false);
        OJson kwargs = c.contains("kwargs") ? c["kwargs"] : OJson::object();
        result["text"] = ct->render(messages, tools, agp, kwargs, o.name);
      } catch (const Error& e) {
        result["error"] = e.what();
      }
      std::cout << result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    std::cout.flush();
    return;
  }

  if (o.messages.empty()) fail("chat-template: --messages is required (or --batch)");
  OJson messages, tools;
  if (!o.tools.empty()) tools = parse_json(read_file(o.tools), o.tools);
  load_conversation(parse_json(read_file(o.messages), o.messages), o.messages, &messages, &tools);
  OJson kwargs = o.kwargs.empty() ? OJson::object() : parse_json(o.kwargs, "--kwargs");
  std::string text = ct->render(messages, tools, o.add_generation_prompt, kwargs, o.name);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

void setup_chat_template(CLI::App& app) {
  auto opts = std::make_shared<ChatTemplateOptions>();
  CLI::App* cmd = app.add_subcommand("chat-template", "Render a conversation with a model's chat template");
  cmd->add_option("--tokenizer", opts->tokenizer, "Directory with tokenizer_config.json, the file itself, or a GGUF model file");
  cmd->add_option("--template", opts->template_file, "A bare Jinja chat template file instead of --tokenizer");
  cmd->add_option("--messages", opts->messages, "JSON file: a list of messages (or {\"messages\": [...]})");
  cmd->add_option("--tools", opts->tools, "JSON file: a list of tool definitions");
  cmd->add_flag("--add-generation-prompt", opts->add_generation_prompt, "End with the assistant turn's header");
  cmd->add_option("--kwargs", opts->kwargs, "JSON object of extra template variables (e.g. enable_thinking)");
  cmd->add_option("--name", opts->name, "Named template (tokenizer_config.json with a list of templates)");
  cmd->add_option("--bos-token", opts->bos_token, "Override bos_token");
  cmd->add_option("--eos-token", opts->eos_token, "Override eos_token");
  cmd->add_option("--batch", opts->batch, "JSONL file of cases; prints one JSON result per line");
  cmd->callback([opts, cmd] {
    opts->has_bos = cmd->count("--bos-token") > 0;
    opts->has_eos = cmd->count("--eos-token") > 0;
    run_chat_template(*opts);
  });
}

const bool kRegistered = register_command(&setup_chat_template);

}  // namespace

}  // namespace astrai::cli
