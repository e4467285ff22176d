// `astrai generate`: one prompt, a chat conversation, or a JSONL file of requests, through the
// inference engine (all JSONL records are submitted at once and batched continuously).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/files.h"
#include "base/json.h"
#include "cli/command.h"
#include "cli/infer_flags.h"
#include "infer/engine.h"

namespace astrai::cli {
namespace {

struct GenerateOptions {
  std::string model, prompt, prompt_ids, messages, input_file, output_file;
  int max_tokens = 256;
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  int64_t seed = -1;
  std::vector<std::string> stop;
  int n = 1;
  int logprobs = -1;
  bool stream = false, json = false, ignore_eos = false, truncate_left = false, include_ids = false;
  EngineFlags engine;
};

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(cur, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != cur.size() || v < 0 || v > INT32_MAX) fail("--prompt-ids: \"", cur, "\" is not a token id");
    ids.push_back(static_cast<int32_t>(v));
    cur.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ') flush();
    else cur.push_back(c);
  }
  flush();
  if (ids.empty()) fail("--prompt-ids: no ids in \"", text, "\"");
  return ids;
}

infer::SamplingParams base_sampling(const GenerateOptions& o) {
  infer::SamplingParams p;
  p.max_tokens = o.max_tokens;
  p.temperature = o.temperature;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p = o.min_p;
  p.repetition_penalty = o.repetition_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  if (o.seed >= 0) p.seed = static_cast<uint64_t>(o.seed);
  p.stop_strings = o.stop;
  p.n = o.n;
  p.logprobs = o.logprobs;
  p.ignore_eos = o.ignore_eos;
  return p;
}

// A JSONL record: `prompt` (text), `prompt_ids` or `messages`, plus sampling fields that
// override the command line's.
infer::GenerationRequest request_from_record(const Json& rec, const GenerateOptions& o, const std::string& where) {
  ASTRAI_CHECK(rec.is_object(), where, ": a record must be a JSON object");
  infer::GenerationRequest r;
  r.sampling = base_sampling(o);
  r.truncate_left = json_optional<bool>(rec, "truncate_left", o.truncate_left, where);
  if (rec.contains("messages")) {
    r.messages = rec["messages"];
    ASTRAI_CHECK(r.messages.is_array(), where, ": \"messages\" must be an array");
    if (rec.contains("tools")) r.tools = rec["tools"];
  } else if (rec.contains("prompt_ids")) {
    r.prompt_ids = json_required<std::vector<int32_t>>(rec, "prompt_ids", where);
  } else {
    r.prompt_text = json_required<std::string>(rec, "prompt", where);
  }
  auto& p = r.sampling;
  p.max_tokens = json_optional<int32_t>(rec, "max_tokens", p.max_tokens, where);
  p.temperature = json_optional<float>(rec, "temperature", p.temperature, where);
  p.top_k = json_optional<int32_t>(rec, "top_k", p.top_k, where);
  p.top_p = json_optional<float>(rec, "top_p", p.top_p, where);
  p.min_p = json_optional<float>(rec, "min_p", p.min_p, where);
  p.repetition_penalty = json_optional<float>(rec, "repetition_penalty", p.repetition_penalty, where);
  p.presence_penalty = json_optional<float>(rec, "presence_penalty", p.presence_penalty, where);
  p.frequency_penalty = json_optional<float>(rec, "frequency_penalty", p.frequency_penalty, where);
  p.n = json_optional<int32_t>(rec, "n", p.n, where);
  p.logprobs = json_optional<int32_t>(rec, "logprobs", p.logprobs, where);
  p.ignore_eos = json_optional<bool>(rec, "ignore_eos", p.ignore_eos, where);
  if (rec.contains("seed") && !rec["seed"].is_null()) p.seed = json_required<uint64_t>(rec, "seed", where);
  if (rec.contains("stop") && !rec["stop"].is_null()) {
    if (rec["stop"].is_string()) p.stop_strings = {rec["stop"].get<std::string>()};
    else p.stop_strings = json_required<std::vector<std::string>>(rec, "stop", where);
  }
  if (rec.contains("stop_token_ids")) p.stop_token_ids = json_required<std::vector<int32_t>>(rec, "stop_token_ids", where);
  return r;
}

Json logprobs_json(const std::vector<infer::TokenLogprob>& lps) {
  Json out = Json::array();
  for (const auto& lp : lps) {
    Json top = Json::array();
    for (const auto& [id, v] : lp.top) top.push_back({{"id", id}, {"logprob", v}});
    out.push_back({{"id", lp.id}, {"logprob", lp.logprob}, {"top", top}});
  }
  return out;
}

Json choice_json(const infer::ChoiceResult& c, bool with_logprobs) {
  Json j = {{"text", c.text}, {"ids", c.token_ids}, {"finish_reason", infer::finish_reason_name(c.finish)}};
  if (with_logprobs) j["logprobs"] = logprobs_json(c.logprobs);
  return j;
}

void check_result(const infer::GenerationResult& r) {
  if (!r.error.empty()) fail("generation failed: ", r.error);
}

void run_single(infer::Engine& engine, const GenerateOptions& o) {
  infer::GenerationRequest req;
  req.sampling = base_sampling(o);
  req.truncate_left = o.truncate_left;
  if (!o.messages.empty()) {
    Json m = read_json_file(o.messages);
    if (m.is_object() && m.contains("messages")) {
      if (m.contains("tools")) req.tools = m["tools"];
      m = m["messages"];
    }
    ASTRAI_CHECK(m.is_array(), o.messages, ": expected a JSON array of messages (or {\"messages\": [...]})");
    req.messages = m;
  } else if (!o.prompt_ids.empty()) {
    req.prompt_ids = parse_id_list(o.prompt_ids);
  } else {
    req.prompt_text = o.prompt;
  }
  const bool stream = o.stream && !o.json;
  std::mutex out_mu;
  infer::StreamCallback cb;
  if (stream) {
    cb = [&](const infer::ChoiceDelta& d) {
      if (d.text.empty() || (o.n > 1 && d.index != 0)) return;  // stream the first choice
      std::lock_guard<std::mutex> lock(out_mu);
      std::fwrite(d.text.data(), 1, d.text.size(), stdout);
      std::fflush(stdout);
    };
  }
  auto result = engine.submit(std::move(req), cb).wait();
  check_result(result);
  for (const auto& c : result.choices) {
    if (o.json) {
      std::cout << choice_json(c, o.logprobs >= 0).dump() << "\n";
    } else if (stream && c.index == 0) {
      std::cout << "\n";
    } else {
      if (o.n > 1) std::cout << "--- choice " << c.index << " (" << infer::finish_reason_name(c.finish) << ") ---\n";
      std::cout << c.text << "\n";
    }
  }
}

void run_jsonl(infer::Engine& engine, const GenerateOptions& o) {
  ASTRAI_CHECK(!o.output_file.empty(), "--input-file needs --output-file");
  std::ifstream in(o.input_file);
  ASTRAI_CHECK(in, o.input_file, ": cannot open");
  std::vector<Json> records;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      records.push_back(Json::parse(line));
    } catch (const Json::parse_error& e) {
      fail(o.input_file, ":", line_no, ": invalid JSON (", e.what(), ")");
    }
  }
  // Submit everything (the engine queues and batches); results come back in input order.
  std::vector<infer::RequestHandle> handles;
  for (size_t i = 0; i < records.size(); ++i)
    handles.push_back(engine.submit(request_from_record(records[i], o, str_cat(o.input_file, " record ", i + 1))));
  std::string out;
  for (size_t i = 0; i < records.size(); ++i) {
    auto r = handles[i].wait();
    check_result(r);
    Json rec = records[i];
    const bool with_lp = r.choices.size() && !r.choices[0].logprobs.empty();
    if (r.choices.size() == 1) {
      rec["response"] = r.choices[0].text;
      rec["finish_reason"] = infer::finish_reason_name(r.choices[0].finish);
      if (o.include_ids) {
        rec["ids"] = r.choices[0].token_ids;
        if (with_lp) rec["logprobs"] = logprobs_json(r.choices[0].logprobs);
      }
    } else {
      Json texts = Json::array(), reasons = Json::array(), ids = Json::array();
      for (const auto& c : r.choices) {
        texts.push_back(c.text);
        reasons.push_back(infer::finish_reason_name(c.finish));
        ids.push_back(c.token_ids);
      }
      rec["response"] = texts;
      rec["finish_reason"] = reasons;
      if (o.include_ids) rec["ids"] = ids;
    }
    if (o.include_ids) rec["cached_prompt_tokens"] = r.cached_prompt_tokens;
    out += rec.dump() + "\n";
  }
  write_file_atomic(o.output_file, out);
}

void run_generate(const GenerateOptions& o) {
  const int sources = !o.prompt.empty() + !o.prompt_ids.empty() + !o.messages.empty() + !o.input_file.empty();
  ASTRAI_CHECK(sources == 1, "give exactly one of --prompt, --prompt-ids, --messages, --input-file");
  auto engine = load_engine(o.model, o.engine);
  if (!o.input_file.empty()) run_jsonl(*engine, o);
  else run_single(*engine, o);
}

void setup_generate(CLI::App& app) {
  auto opts = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate text with the inference engine");
  cmd->add_option("--model", opts->model, "Model directory (config.json, safetensors, tokenizer.json) or GGUF file")->required();
  cmd->add_option("--prompt", opts->prompt, "Prompt text");
  cmd->add_option("--prompt-ids", opts->prompt_ids, "Prompt as token ids \"1,2,3\"");
  cmd->add_option("--messages", opts->messages, "Chat messages JSON file (rendered with the chat template)");
  cmd->add_option("--input-file", opts->input_file,
                  "JSONL requests: {\"prompt\"|\"prompt_ids\"|\"messages\", sampling fields...}");
  cmd->add_option("--output-file", opts->output_file, "JSONL results: input fields + response + finish_reason");
  cmd->add_option("--max-tokens", opts->max_tokens, "Tokens to generate at most (clamped to the context)");
  cmd->add_option("--temperature", opts->temperature, "0 = greedy");
  cmd->add_option("--top-k", opts->top_k, "0 = off");
  cmd->add_option("--top-p", opts->top_p);
  cmd->add_option("--min-p", opts->min_p);
  cmd->add_option("--repetition-penalty", opts->repetition_penalty);
  cmd->add_option("--presence-penalty", opts->presence_penalty);
  cmd->add_option("--frequency-penalty", opts->frequency_penalty);
  cmd->add_option("--seed", opts->seed, "Seed (same seed, same output)");
  cmd->add_option("--stop", opts->stop, "Stop strings (not included in the output)");
  cmd->add_option("--n", opts->n, "Choices per prompt");
  cmd->add_option("--logprobs", opts->logprobs, "Log-probs of chosen tokens plus top N (with --json)");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "Do not stop at EOS / end-of-turn tokens");
  cmd->add_flag("--truncate-left", opts->truncate_left, "Keep the newest tokens of an over-long prompt");
  cmd->add_flag("--stream", opts->stream, "Print text as it is generated");
  cmd->add_flag("--json", opts->json, "One JSON line per choice: {\"text\", \"ids\", \"finish_reason\"}");
  cmd->add_flag("--include-ids", opts->include_ids, "JSONL output: add ids, logprobs, cached_prompt_tokens");
  opts->engine.add(cmd);
  cmd->callback([opts] { run_generate(*opts); });
}

const bool kRegistered = register_command(&setup_generate);

}  // namespace
}  // namespace astrai::cli
