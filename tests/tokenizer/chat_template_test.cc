// ChatTemplate: tokenizer_config.json loading (string or named list, AddedToken objects), the
// variables HF passes to templates, and template selection. Real templates are checked against
// Python jinja2 by chat_template_oracle.py.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <vector>

#include "base/error.h"

namespace astrai::tokenizer {
namespace {

using OJson = nlohmann::ordered_json;

// The directories write_config made, removed when the test binary exits.
struct TempDirs {
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
TempDirs g_temp_dirs;

std::string write_config(const std::string& name, const OJson& cfg) {
  auto dir = std::filesystem::temp_directory_path() / ("astrai_ct_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  g_temp_dirs.dirs.push_back(dir);
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
  return dir.string();
}

const char* kChatMl =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST(ChatTemplate, RendersFromConfigDirectoryOrFile) {
  OJson cfg = {{"chat_template", kChatMl}, {"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}, {"lstrip", false}}}};
  std::string dir = write_config("basic", cfg);
  OJson msgs = OJson::parse(R"([{"role": "user", "content": "Hi"}])");
  for (const std::string& path : {dir, dir + "/tokenizer_config.json"}) {
    ChatTemplate ct = ChatTemplate::from_tokenizer_config(path);
    EXPECT_EQ(ct.render(msgs, nullptr, true), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(ct.render(msgs, nullptr, false), "<|im_start|>user\nHi<|im_end|>\n");
    EXPECT_EQ(ct.special_tokens().at("eos_token"), "</s>");
  }
}

TEST(ChatTemplate, PassesHfVariables) {
  ChatTemplate ct("{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ tools is none }}|"
                  "{{ documents is none }}|{{ add_generation_prompt }}|{{ enable_thinking | default('unset') }}",
                  {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  OJson msgs = OJson::array();
  EXPECT_EQ(ct.render(msgs), "<s>|</s>|False|True|True|False|unset");
  EXPECT_EQ(ct.render(msgs, nullptr, true, {{"enable_thinking", false}, {"bos_token", "B"}}),
            "B|</s>|False|True|True|True|False");
}

TEST(ChatTemplate, ToolsReachTheTemplateInOrder) {
  ChatTemplate ct("{% for t in tools %}{{ t | tojson }}{% endfor %}");
  OJson tools = OJson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}])");
  EXPECT_EQ(ct.render(OJson::array(), tools),
            R"({"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}})");
}

TEST(ChatTemplate, NamedTemplatesFollowHfSelection) {
  OJson cfg = {{"chat_template", OJson::array({{{"name", "default"}, {"template", "D"}},
                                               {{"name", "tool_use"}, {"template", "T"}},
                                               {{"name", "rag"}, {"template", "R"}}})}};
  ChatTemplate ct = ChatTemplate::from_tokenizer_config(write_config("named", cfg));
  OJson msgs = OJson::array();
  EXPECT_EQ(ct.render(msgs), "D");
  EXPECT_EQ(ct.render(msgs, OJson::array({OJson::object()})), "T");
  EXPECT_EQ(ct.render(msgs, nullptr, false, OJson::object(), "rag"), "R");
  EXPECT_THROW(ct.render(msgs, nullptr, false, OJson::object(), "nope"), Error);

  OJson only_tools = {{"chat_template", OJson::array({{{"name", "tool_use"}, {"template", "T"}}})}};
  ChatTemplate t2 = ChatTemplate::from_tokenizer_config(write_config("only_tools", only_tools));
  EXPECT_THROW(t2.render(msgs), Error);  // no default, no tools: HF refuses too
}

TEST(ChatTemplate, ClearErrors) {
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(write_config("none", {{"bos_token", "<s>"}})), Error);
  EXPECT_THROW(ChatTemplate::from_tokenizer_config("/nonexistent/dir"), Error);
  try {
    ChatTemplate::from_tokenizer_config(write_config("bad", {{"chat_template", "{% if x %}"}}));
    FAIL() << "expected a parse error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat template 'default'"), std::string::npos) << e.what();
  }
  ChatTemplate ct("{{ raise_exception('System role not supported') }}");
  try {
    ct.render(OJson::array());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("System role not supported"), std::string::npos);
  }
  EXPECT_THROW(ct.render(OJson::object()), Error);  // messages must be a list
}

}  // namespace
}  // namespace astrai::tokenizer
