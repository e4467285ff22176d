// The BPE model of Hugging Face `tokenizers` (models/bpe): merges applied lowest rank
// first, leftmost first among equal ranks; unknown characters go to byte fallback
// (<0xXX> tokens) or the unk token (fused when fuse_unk); ignore_merges looks the whole
// word up first. Words are cached.
//
// In byte-level mode (the pre-tokenizer ends with ByteLevel) the model works on raw
// bytes: each vocabulary entry is stored by the bytes its byte-level characters stand
// for, so encoding never materialises the byte-to-character mapping. This is exact
// because every byte maps to exactly one character of the byte-level alphabet.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/json.h"

namespace astrai::tokenizer {

// Transparent hash so maps keyed by std::string can be probed with string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// The 256-entry GPT-2 byte <-> character table.
const std::array<char32_t, 256>& byte_to_char_table();
// Maps a byte-level token string back to its bytes; nullopt when a character is outside
// the alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view token);
std::string bytes_to_byte_level(std::string_view bytes);

class Bpe {
 public:
  // `model` is tokenizer.json's "model" object; `byte_level` selects byte-unit mode.
  Bpe(const Json& model, bool byte_level);
  ~Bpe();

  // Appends the ids of one pre-tokenized word (in byte-level mode: raw bytes).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;  // token as in the vocab
  const std::string* id_to_token(int32_t id) const;
  size_t vocab_size() const { return id_to_token_.size(); }
  size_t entries() const { return vocab_.size(); }  // HF Model::get_vocab_size
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct PairMap;
  struct Cache;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  bool byte_level_;
  Vocab vocab_;        // token string (as in tokenizer.json) -> id
  Vocab unit_vocab_;   // byte-level mode: raw bytes -> id; else unused (vocab_ is used)
  std::vector<std::string> id_to_token_;  // indexed by id; empty string for holes
  std::unique_ptr<PairMap> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  std::array<int32_t, 256> byte_ids_;     // byte-level: id of each single byte (-1: none)
  std::array<int32_t, 256> fallback_ids_;  // byte_fallback: id of <0xXX> (-1: none)
  std::unique_ptr<Cache> cache_;
};

}  // namespace astrai::tokenizer
