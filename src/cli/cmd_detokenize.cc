// `astrai detokenize --tokenizer DIR --ids "1,2,3" [--skip-special]`: ids back to text.
#include <iostream>
#include <string>

#include "base/error.h"
#include "cli/command.h"
#include "tokenizer/tokenizer.h"

namespace astrai::cli {

namespace {

struct DetokenizeOptions {
  std::string tokenizer;
  std::string ids;
  bool skip_special = false;
};

std::vector<int32_t> parse_ids(const std::string& s, const tokenizer::Tokenizer& tok) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || s[i] == ' ' || s[i] == '[' || s[i] == ']' || s[i] == '\n')) ++i;
    if (i >= s.size()) break;
    size_t j = i;
    while (j < s.size() && s[j] != ',' && s[j] != ' ' && s[j] != ']' && s[j] != '\n') ++j;
    std::string item = s.substr(i, j - i);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) fail("detokenize: \"", item, "\" is not a token id");
    if (!tok.id_to_token(int32_t(v))) fail("detokenize: id ", v, " is not in the vocabulary");
    ids.push_back(int32_t(v));
    i = j;
  }
  return ids;
}

void setup_detokenize(CLI::App& app) {
  auto o = std::make_shared<DetokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("detokenize", "Decode token ids to text");
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer directory, tokenizer.json, or a GGUF model file")->required();
  cmd->add_option("--ids", o->ids, "Token ids, comma or space separated")->required();
  cmd->add_flag("--skip-special", o->skip_special, "Drop special tokens");
  cmd->callback([o] {
    tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(o->tokenizer);
    std::cout << tok.decode(parse_ids(o->ids, tok), o->skip_special) << "\n";
  });
}

const bool kRegistered = register_command(&setup_detokenize);

}  // namespace

}  // namespace astrai::cli
