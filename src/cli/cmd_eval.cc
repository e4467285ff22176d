// `astrai eval perplexity` and `astrai eval tasks`: perplexity with a sliding window, and
// multiple-choice log-likelihood tasks, scored through the inference engine (or a server).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "base/error.h"
#include "base/timer.h"
#include "cli/command.h"
#include "cli/infer_flags.h"
#include "eval/choice_scorer.h"
#include "eval/perplexity.h"
#include "eval/token_stream.h"

namespace astrai::cli {

namespace {

// "<what>: done/total <unit>" on stderr at most every two seconds, and once at the end of a
// run that printed any.
class Progress {
 public:
  Progress(const char* what, const char* unit, size_t total) : what_(what), unit_(unit), total_(total) {}
  void operator()(size_t done) {
    const double t = timer_.seconds();
    if (t < next_ && done < total_) return;
    if (done == total_ && !printed_) return;  // short runs stay quiet
    std::fprintf(stderr, "%s: %zu/%zu %s, %.1f s\n", what_, done, total_, unit_, t);
    printed_ = true;
    next_ = t + 2.0;
  }

 private:
  const char* what_;
  const char* unit_;
  size_t total_;
  Timer timer_;
  double next_ = 2.0;
  bool printed_ = false;
};

struct PerplexityOptions {
  std::string model, data;
  int64_t context = -1, stride = -1;  // -1: the defaults
  bool json = false;
  EngineFlags engine;
};

void run_perplexity(const PerplexityOptions& o) {
  const Timer timer;
  ASTRAI_CHECK(model_has_tokenizer(o.model), "--model ", o.model,
               ": no tokenizer.json (perplexity decodes tokens to count bytes and encodes text files)");
  const auto engine = load_engine(o.model, o.engine);
  const int64_t limit = eval::max_scored_length(*engine);
  const int64_t context = o.context != -1 ? o.context : std::min<int64_t>(1024, limit);
  const int64_t stride = o.stride != -1 ? o.stride : std::max<int64_t>(1, context / 2);
  eval::check_window_options(context, stride);
  ASTRAI_CHECK(context <= limit, "--context ", context, " is longer than the engine scores: at most ", limit,
               " (the model's context or the KV cache, less the one token the engine computes past a prompt)");
  const std::vector<int32_t> ids = eval::load_token_stream(o.data, engine->tokenizer(), engine->model().vocab_size());
  const std::vector<eval::Window> windows = eval::sliding_windows(static_cast<int64_t>(ids.size()), context, stride);
  std::vector<eval::ScoreSpan> spans;
  for (const eval::Window& w : windows)
    spans.push_back({std::span<const int32_t>(ids).subspan(w.begin, w.end - w.begin), w.first - w.begin});
  Progress progress("eval perplexity", "windows", spans.size());
  const std::vector<eval::SpanScore> scores = eval::score_spans(*engine, spans, std::ref(progress));

  eval::PerplexityResult r;
  r.tokens = static_cast<int64_t>(ids.size());
  r.windows = static_cast<int64_t>(windows.size());
  r.context = context;
  r.stride = stride;
  for (const eval::SpanScore& s : scores) {
    r.nll -= s.logprob;
    r.scored_tokens += s.tokens;
  }
  r.scored_bytes = eval::scored_bytes(engine->tokenizer(), ids, windows);
  r.seconds = timer.seconds();
  if (o.json) {
    std::cout << r.to_json().dump() << "\n";
    return;
  }
  std::printf("tokens           %lld (%lld windows of %lld, stride %lld)\n", (long long)r.tokens, (long long)r.windows,
              (long long)r.context, (long long)r.stride);
  std::printf("scored tokens    %lld\n", (long long)r.scored_tokens);
  std::printf("nll/token        %.6f\n", r.nll_per_token());
  std::printf("perplexity       %.4f\n", r.perplexity());
  std::printf("scored bytes     %lld\n", (long long)r.scored_bytes);
  if (r.scored_bytes > 0) {
    std::printf("bits/byte        %.6f\n", r.bits_per_byte());
    std::printf("byte perplexity  %.6f\n", r.byte_perplexity());
  } else {
    std::printf("bits/byte        - (the scored tokens decode to no text)\n");
  }
  std::printf("time             %.2f s\n", r.seconds);
}

struct TasksOptions {
  std::string model, url, tasks;
  eval::ApiOptions api;
  bool json = false;
  EngineFlags engine;
};

void run_tasks(const TasksOptions& o) {
  const Timer timer;
  ASTRAI_CHECK(o.model.empty() != o.url.empty(), "eval tasks: give exactly one of --model DIR or --url URL");
  const std::vector<eval::Question> questions = eval::read_questions(o.tasks);
  size_t choices = 0;
  for (const auto& q : questions) choices += q.choices.size();
  Progress progress("eval tasks", "choices", choices);
  std::vector<std::vector<eval::ChoiceScore>> scores;
  if (!o.url.empty()) {
    eval::ApiOptions api = o.api;
    api.url = o.url;
    scores = eval::make_api_choice_scorer(api)->score(questions, std::ref(progress));
  } else {
    ASTRAI_CHECK(model_has_tokenizer(o.model), "--model ", o.model, ": no tokenizer.json to encode the tasks");
    const auto engine = load_engine(o.model, o.engine);
    scores = eval::make_engine_choice_scorer(*engine)->score(questions, std::ref(progress));
  }
  eval::TaskResult r = eval::summarize_tasks(questions, scores);
  r.seconds = timer.seconds();
  if (o.json) {
    std::cout << r.to_json().dump() << "\n";
    return;
  }
  std::printf("questions  %lld (%zu choices)\n", (long long)r.questions, choices);
  std::printf("acc        %.4f (%lld right)\n", r.acc(), (long long)r.correct);
  std::printf("acc_norm   %.4f (%lld right)\n", r.acc_norm(), (long long)r.correct_norm);
  std::printf("time       %.2f s\n", r.seconds);
}

void setup_perplexity(CLI::App* eval) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = eval->add_subcommand(
      "perplexity",
      "Perplexity of a text file or token dataset with a sliding window: windows of --context tokens every "
      "--stride tokens, each scoring only the tokens no earlier window scored; per token and per UTF-8 byte (the "
      "bytes the scored tokens decode to, special tokens skipped)");
  cmd->add_option("--model", o->model, "Model directory (config.json, safetensors, tokenizer.json) or GGUF file")->required();
  cmd->add_option("--data", o->data,
                  "A text file (encoded whole with the model's tokenizer, special tokens added as by default: a BOS "
                  "where the tokenizer adds one) or a dataset directory from `astrai preprocess` (its `sequence` key as "
                  "one stream; not padded, i.e. --packing none)")
      ->required();
  cmd->add_option("--context", o->context,
                  "Tokens per window, at least 2 (default: 1024, or less when the engine scores less: the model's context "
                  "or the KV cache, less the one token the engine computes past a prompt)");
  cmd->add_option("--stride", o->stride,
                  "Tokens between window starts, 1 to --context (default: half the context); with --stride equal to "
                  "--context the windows do not overlap and each window's first token is not scored");
  cmd->add_flag("--json", o->json,
                "Print one JSON object: tokens, windows, context, stride, scored_tokens, scored_bytes, nll, "
                "nll_per_token, perplexity, bits_per_byte, byte_perplexity, seconds");
  o->engine.add(cmd);
  cmd->callback([o] { run_perplexity(*o); });
}

void setup_tasks(CLI::App* eval) {
  auto o = std::make_shared<TasksOptions>();
  CLI::App* cmd = eval->add_subcommand(
      "tasks",
      "Multiple-choice log-likelihood tasks from JSONL ({\"question\", \"choices\", \"answer\"} per line): each "
      "choice scored as the sum of log p(choice tokens | question); acc and acc_norm (sum per UTF-8 byte of the "
      "choice). Trailing whitespace of the question moves to the front of each choice before tokenizing, as "
      "lm-evaluation-harness does; no space is added. The engine options below apply with --model");
  cmd->add_option("--tasks", o->tasks, "JSONL file of questions")->required();
  cmd->add_option("--model", o->model, "Score locally with this model directory (needs tokenizer.json) or GGUF file");
  cmd->add_option("--url", o->url,
                  "Score over an OpenAI-compatible server instead: http://HOST:PORT or a base URL ending in /v1 (posts "
                  "to .../v1/completions), or the endpoint's full URL; the server tokenizes");
  cmd->add_option("--api-key", o->api.api_key, "With --url: sent as \"Authorization: Bearer KEY\"");
  cmd->add_option("--parallel", o->api.parallel, "With --url: requests in flight")->capture_default_str();
  cmd->add_option("--timeout", o->api.timeout_seconds, "With --url: seconds to wait for each response")
      ->capture_default_str();
  cmd->add_flag("--json", o->json,
                "Print one JSON object: questions, acc, acc_norm, correct, correct_norm, seconds, and per_question "
                "[{line, answer, pred, pred_norm, logprobs, tokens}]");
  o->engine.add(cmd);
  cmd->callback([o] { run_tasks(*o); });
}

void setup_eval(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a model: perplexity, multiple-choice tasks");
  eval->require_subcommand(1);
  setup_perplexity(eval);
  setup_tasks(eval);
}

const bool kRegistered = register_command(&setup_eval);

}  // namespace

}  // namespace astrai::cli
