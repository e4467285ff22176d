// `astrai tokenizer train|encode|decode`.
//   train:  --input FILES... --vocab-size N [--special-tokens T...] [--min-frequency F] --output DIR
//   encode: same as `astrai tokenize`; decode: same as `astrai detokenize`.
#include <iostream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/command.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/trainer.h"

namespace astrai::cli {

namespace {

struct TrainOptions {
  std::vector<std::string> inputs;
  size_t vocab_size = 16384;
  std::vector<std::string> special;
  uint64_t min_frequency = 2;
  std::string output;
};

struct CodecOptions {
  std::string tokenizer, text, ids;
  bool no_special = false, skip_special = false;
};

void setup_tokenizer(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenizer", "Train, encode and decode byte-level BPE tokenizers");
  cmd->require_subcommand(1);

  auto t = std::make_shared<TrainOptions>();
  CLI::App* train = cmd->add_subcommand("train", "Train a byte-level BPE tokenizer.json from text files");
  train->add_option("--input", t->inputs, "Training text files")->required()->check(CLI::ExistingFile);
  train->add_option("--vocab-size", t->vocab_size, "Vocabulary size (special + 256 byte + merged tokens)");
  train->add_option("--special-tokens", t->special,
                    "Extra special tokens (<|endoftext|>, <|im_start|>, <|im_end|> are always added)");
  train->add_option("--min-frequency", t->min_frequency, "Never merge pairs seen fewer times");
  train->add_option("--output", t->output, "Output directory")->required();
  train->callback([t] {
    tokenizer::TrainerOptions o;
    o.vocab_size = t->vocab_size;
    o.special_tokens = t->special;
    o.min_frequency = t->min_frequency;
    o.progress = true;
    Timer timer;
    Json j = tokenizer::train_bpe_files(t->inputs, o);
    tokenizer::save_trained_tokenizer(t->output, j);
    std::cerr << "tokenizer train: " << j["model"]["vocab"].size() << " tokens, " << j["model"]["merges"].size()
              << " merges in " << timer.seconds() << " s -> " << t->output << "\n";
  });

  auto c = std::make_shared<CodecOptions>();
  CLI::App* enc = cmd->add_subcommand("encode", "Encode text (prints ids)");
  enc->add_option("--tokenizer", c->tokenizer, "Tokenizer directory, tokenizer.json, or a GGUF model file")->required();
  enc->add_option("--text", c->text, "Text")->required();
  enc->add_flag("--no-special", c->no_special, "Do not add BOS/EOS from the post-processor");
  enc->callback([c] {
    auto tok = tokenizer::Tokenizer::load(c->tokenizer);
    std::string line;
    for (int32_t id : tok.encode(c->text, !c->no_special)) line += (line.empty() ? "" : " ") + std::to_string(id);
    std::cout << line << "\n";
  });
  CLI::App* dec = cmd->add_subcommand("decode", "Decode ids (comma or space separated)");
  dec->add_option("--tokenizer", c->tokenizer, "Tokenizer directory, tokenizer.json, or a GGUF model file")->required();
  dec->add_option("--ids", c->ids, "Ids")->required();
  dec->add_flag("--skip-special", c->skip_special, "Drop special tokens");
  dec->callback([c] {
    auto tok = tokenizer::Tokenizer::load(c->tokenizer);
    std::vector<int32_t> ids;
    std::string cur;
    for (char ch : c->ids + ",") {
      if (ch == ',' || ch == ' ') {
        if (cur.empty()) continue;
        size_t used = 0;
        long long v = std::stoll(cur, &used);
        if (used != cur.size() || v < 0 || v > INT32_MAX || !tok.id_to_token(int32_t(v)))
          fail("tokenizer decode: \"", cur, "\" is not a token id of this vocabulary");
        ids.push_back(int32_t(v));
        cur.clear();
      } else {
        cur += ch;
      }
    }
    std::cout << tok.decode(ids, c->skip_special) << "\n";
  });
}

const bool kRegistered = register_command(&setup_tokenizer);

}  // namespace

}  // namespace astrai::cli
