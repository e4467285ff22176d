// `astrai chat`: a terminal conversation with streaming output. Commands: /reset (forget the
// history), /system TEXT (set the system prompt and reset), /exit.
#include <cstdio>
#include <iostream>
#include <string>

#include "base/error.h"
#include "base/json.h"
#include "cli/command.h"
#include "cli/infer_flags.h"
#include "infer/engine.h"

namespace astrai::cli {
namespace {

struct ChatOptions {
  std::string model, system;
  int max_tokens = 1024;
  float temperature = 0.7f, top_p = 0.95f;
  int top_k = 0;
  int64_t seed = -1;
  EngineFlags engine;
};

void run_chat(const ChatOptions& o) {
  auto engine = load_engine(o.model, o.engine);
  std::string system = o.system;
  Json history = Json::array();
  std::fprintf(stderr, "astrai chat: /reset clears the history, /system TEXT sets the system prompt, /exit quits\n");
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    std::fflush(stderr);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history = Json::array();
      std::fprintf(stderr, "(history cleared)\n");
      continue;
    }
    if (line.rfind("/system", 0) == 0) {
      system = line.size() > 8 ? line.substr(8) : "";
      history = Json::array();
      std::fprintf(stderr, "(system prompt set; history cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    history.push_back({{"role", "user"}, {"content", line}});
    infer::GenerationRequest req;
    req.messages = Json::array();
    if (!system.empty()) req.messages.push_back({{"role", "system"}, {"content", system}});
    for (const auto& m : history) req.messages.push_back(m);
    // Long conversations keep their newest tokens rather than failing.
    req.truncate_left = true;
    req.sampling.max_tokens = o.max_tokens;
    req.sampling.temperature = o.temperature;
    req.sampling.top_p = o.top_p;
    req.sampling.top_k = o.top_k;
    if (o.seed >= 0) req.sampling.seed = static_cast<uint64_t>(o.seed);
    infer::GenerationResult r;
    try {
      r = engine
              ->submit(std::move(req),
                       [](const infer::ChoiceDelta& d) {
                         std::fwrite(d.text.data(), 1, d.text.size(), stdout);
                         std::fflush(stdout);
                       })
              .wait();
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      history.erase(history.end() - 1);
      continue;
    }
    std::printf("\n");
    if (!r.error.empty()) {
      std::fprintf(stderr, "error: %s\n", r.error.c_str());
      history.erase(history.end() - 1);
      continue;
    }
    history.push_back({{"role", "assistant"}, {"content", r.choices[0].text}});
    std::fprintf(stderr, "[%d prompt tokens (%d cached), %d generated, %.2fs, %s]\n", r.prompt_tokens,
                 r.cached_prompt_tokens, r.completion_tokens, r.total_seconds,
                 infer::finish_reason_name(r.choices[0].finish));
  }
}

void setup_chat(CLI::App& app) {
  auto opts = std::make_shared<ChatOptions>();
  auto* cmd = app.add_subcommand("chat", "Chat with a model in the terminal (streaming)");
  cmd->add_option("--model", opts->model, "Model directory with tokenizer.json and a chat template, or a GGUF file")->required();
  cmd->add_option("--system", opts->system, "System prompt");
  cmd->add_option("--max-tokens", opts->max_tokens);
  cmd->add_option("--temperature", opts->temperature);
  cmd->add_option("--top-p", opts->top_p);
  cmd->add_option("--top-k", opts->top_k);
  cmd->add_option("--seed", opts->seed);
  opts->engine.add(cmd);
  cmd->callback([opts] { run_chat(*opts); });
}

const bool kRegistered = register_command(&setup_chat);

}  // namespace
}  // namespace astrai::cli
