// `astrai tokenize`: text to token ids with a Hugging Face tokenizer.json.
//   astrai tokenize --tokenizer DIR --text "Hello" [--json] [--no-special]
//   astrai tokenize --tokenizer DIR --file input.txt
// Hidden test/benchmark mode: --batch-jsonl FILE reads one {"text": ..., "special": bool}
// (or {"hex": "..."} for raw bytes, decoded lossily first) per line and writes one
// {"ids", "decoded", "decoded_skip", "stream"} line each, so the oracle test runs the
// binary once for thousands of inputs.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "base/error.h"
#include "base/files.h"
#include "base/json.h"
#include "base/timer.h"
#include "cli/command.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace astrai::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  std::string file;
  bool json = false;
  bool no_special = false;
  std::string batch;
};

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string from_hex(const std::string& hex) {
  if (hex.size() % 2) fail("tokenize: odd-length hex string");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

void run_batch(const tokenizer::Tokenizer& tok, const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("tokenize: cannot open ", path);
  std::string line;
  std::string out;
  tokenizer::StreamDecoder stream(tok);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    Json req = Json::parse(line);
    Json res;
    try {
      std::string text = req.contains("hex") ? tokenizer::utf8_lossy(from_hex(req["hex"].get<std::string>()))
                                             : req.at("text").get<std::string>();
      bool special = req.value("special", true);
      std::vector<int32_t> ids = tok.encode(text, special);
      res["ids"] = ids;
      res["decoded"] = tok.decode(ids, false);
      res["decoded_skip"] = tok.decode(ids, true);
      std::string streamed;
      stream.reset();
      for (int32_t id : ids) streamed += stream.step(id);
      streamed += stream.flush();
      res["stream"] = streamed;
      if (req.contains("hex")) res["text"] = text;
    } catch (const Error& e) {
      res = Json{{"error", e.what()}};
    }
    out += dump(res);
    out += '\n';
    if (out.size() > (1 << 20)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void run_tokenize(const TokenizeOptions& o) {
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(o.tokenizer);
  if (!o.batch.empty()) return run_batch(tok, o.batch);
  if (o.text.empty() == o.file.empty()) fail("tokenize: give exactly one of --text or --file");
  std::string text = o.file.empty() ? o.text : read_file(o.file);
  std::vector<int32_t> ids = tok.encode(text, !o.no_special);
  if (o.json) {
    Json tokens = Json::array();
    for (int32_t id : ids) tokens.push_back(tok.id_to_token(id).value_or(""));
    std::cout << dump(Json{{"ids", ids}, {"tokens", tokens}}) << "\n";
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ' ';
      line += std::to_string(ids[i]);
    }
    std::cout << line << "\n";
  }
}

void setup_tokenize(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text to token ids with a tokenizer.json or a GGUF file's vocabulary");
  cmd->add_option("--tokenizer", opts->tokenizer, "Tokenizer directory, tokenizer.json, or a GGUF model file")->required();
  cmd->add_option("--text", opts->text, "Text to encode");
  cmd->add_option("--file", opts->file, "File whose contents to encode");
  cmd->add_flag("--json", opts->json, "Print {\"ids\": [...], \"tokens\": [...]}");
  cmd->add_flag("--no-special", opts->no_special, "Do not add the post-processor's special tokens (BOS etc.)");
  cmd->add_option("--batch-jsonl", opts->batch, "Test mode: JSONL in, JSONL out")->group("");
  cmd->callback([opts] { run_tokenize(*opts); });
}

const bool kRegistered = register_command(&setup_tokenize);

}  // namespace

}  // namespace astrai::cli
