// Byte-level BPE training (what `astrai tokenizer train` runs): counts pre-tokenized words
// with the same Split regex + ByteLevel pre-tokenizer the written tokenizer.json uses,
// then repeatedly merges the most frequent adjacent pair (ties: smallest pair of ids) with
// incremental pair counts, so each merge only touches the words containing the pair.
// Deterministic: the same inputs and options give byte-identical files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"

namespace astrai::tokenizer {

struct TrainerOptions {
  size_t vocab_size = 16384;                // including special tokens and the 256 bytes
  std::vector<std::string> special_tokens;  // ids 0..n-1, in this order
  uint64_t min_frequency = 2;               // pairs seen fewer times are never merged
  bool progress = false;                    // log progress to stderr
};

// The special tokens every trained tokenizer gets (the ChatML template needs them),
// first in this order, followed by the caller's extra ones.
const std::vector<std::string>& default_special_tokens();
// ChatML template written to tokenizer_config.json.
const std::string& chatml_template();

// Trains on the UTF-8 texts (invalid bytes are replaced by U+FFFD first) and returns the
// tokenizer.json document.
Json train_bpe(const std::vector<std::string>& texts, const TrainerOptions& options);
// Reads the files and trains.
Json train_bpe_files(const std::vector<std::string>& paths, const TrainerOptions& options);
// tokenizer_config.json for a trained tokenizer (bos/eos/pad, ChatML template).
Json trained_tokenizer_config();
// Writes tokenizer.json and tokenizer_config.json into dir (created if needed).
void save_trained_tokenizer(const std::string& dir, const Json& tokenizer_json);

}  // namespace astrai::tokenizer
