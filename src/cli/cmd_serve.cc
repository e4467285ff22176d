// `astrai serve`: OpenAI- and Anthropic-compatible HTTP server (docs/server.md).
#include <pthread.h>
#include <signal.h>

#include <cctype>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/parallel.h"
#include "base/timer.h"
#include "cli/command.h"
#include "cli/infer_flags.h"
#include "infer/engine.h"
#include "model/transformer.h"
#include "serve/server.h"
#include "serve/tool_recognizer.h"
#include "tokenizer/tokenizer.h"

namespace astrai::cli {

namespace {

struct ServeOptions {
  std::string model;
  std::string tokenizer;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  std::string model_name;
  int max_running = 64;
  int max_queue = 1024;
  std::string kv_cache_memory = "512M";
  std::string kv_dtype = "auto";
  int threads = 0;
  int http_threads = 4;
  std::string max_request_size = "8M";
  double grace_seconds = 30;
  int max_context = 0;
  bool no_mmap = false;
  std::string device = "cpu";
  std::string sample_on = "auto";
  std::string lora;
};

// "512M", "2G", "1.5GiB", "1048576" -> bytes.
int64_t parse_size(const std::string& text, const char* flag) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    fail(flag, ": not a size: \"", text, "\" (e.g. 512M, 2G)");
  }
  std::string unit = text.substr(used);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") scale = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else fail(flag, ": unknown unit in \"", text, "\" (use K, M or G)");
  ASTRAI_CHECK(value > 0, flag, ": must be positive, got \"", text, "\"");
  return static_cast<int64_t>(value * scale);
}

void run_serve(const ServeOptions& o) {
  // Signals go to this thread only (sigwait below); every thread started later inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (o.threads > 0) set_num_threads(o.threads);
  const std::string tokenizer_dir = o.tokenizer.empty() ? o.model : o.tokenizer;
  std::string name = o.model_name;
  if (name.empty()) name = std::filesystem::path(o.model).lexically_normal().filename().string();
  if (name.empty() || name == ".") name = std::filesystem::path(o.model).lexically_normal().parent_path().filename().string();

  // The tokenizer is small and needed by the HTTP layer (token text for logprobs): load it
  // first, then listen (health answers 503) while the weights load.
  auto tok = std::make_shared<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(tokenizer_dir));
  serve::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.api_keys = o.api_keys;
  so.model_name = name;
  so.threads = o.http_threads;
  so.max_body_bytes = static_cast<size_t>(parse_size(o.max_request_size, "--max-request-size"));
  serve::Server server(
      so, [tok](int32_t id) { return tok->token_text(id); },
      serve::tool_recognizer_factory(*tok));
  server.start();
  log_info("serve: listening on http://", o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host, ":",
           server.port(), " (model '", name, "' loading)");

  Timer timer;
  auto model = std::make_shared<model::Transformer>(
      model::Transformer::load(o.model, weight_placement(o.no_mmap), parse_device(o.device), o.lora));
  infer::EngineOptions eo;
  eo.max_running = o.max_running;
  eo.max_queue = o.max_queue;
  eo.kv_cache_bytes = parse_size(o.kv_cache_memory, "--kv-cache-memory");
  eo.prefault_kv = true;  // the memory asked for is committed at start; no page faults in the first requests
  eo.kv_dtype = o.kv_dtype;
  eo.max_context = o.max_context;
  eo.sample_on = o.sample_on;
  auto engine = std::make_shared<infer::Engine>(model, tok, eo);
  server.set_engine(engine);
  log_info("serve: ready in ", timer.seconds(), " s; max context ", engine->max_context(), " tokens, KV cache ",
           engine->kv_capacity_tokens(), " tokens (", dtype_name(engine->kv_dtype()), ")");

  int sig = 0;
  sigwait(&signals, &sig);
  log_info("serve: ", sig == SIGINT ? "SIGINT" : "SIGTERM", ": draining (grace ", o.grace_seconds, " s)");
  server.shutdown(o.grace_seconds);
  log_info("serve: stopped");
}

void setup_serve(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over OpenAI- and Anthropic-compatible HTTP APIs");
  cmd->add_option("--model", opts->model, "Model directory (config.json + safetensors) or GGUF file")->required();
  cmd->add_option("--tokenizer", opts->tokenizer, "Tokenizer directory or GGUF file (default: the model's)");
  cmd->add_option("--host", opts->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", opts->port, "Port (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", opts->api_keys, "Accepted API key (repeatable); none = no authentication");
  cmd->add_option("--model-name", opts->model_name, "Name clients use (default: the model directory's name)");
  cmd->add_option("--max-running", opts->max_running, "Requests in the running batch")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-queue", opts->max_queue, "Queued requests before 429")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--kv-cache-memory", opts->kv_cache_memory, "KV cache size (e.g. 512M, 4G), committed (faulted in) at start")->capture_default_str();
  add_kv_dtype_option(cmd, &opts->kv_dtype);
  add_no_mmap_flag(cmd, &opts->no_mmap);
  add_device_option(cmd, &opts->device);
  add_sample_on_option(cmd, &opts->sample_on);
  add_lora_option(cmd, &opts->lora);
  cmd->add_option("--threads", opts->threads, "Compute threads (0 = all cores)")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--http-threads", opts->http_threads, "Request workers (parsing, templating, formatting)")
      ->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_option("--max-request-size", opts->max_request_size, "Largest request body (413 beyond)")->capture_default_str();
  cmd->add_option("--grace", opts->grace_seconds, "Seconds running requests may finish after SIGINT/SIGTERM")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-context", opts->max_context, "Context limit (0 = the model's)")->capture_default_str();
  cmd->callback([opts] { run_serve(*opts); });
}

const bool kRegistered = register_command(&setup_serve);

}  // namespace

}  // namespace astrai::cli
