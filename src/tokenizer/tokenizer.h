// Tokenizer: loads a Hugging Face tokenizer.json (+ tokenizer_config.json) and encodes /
// decodes exactly as the official `tokenizers` library does (ids equal byte for byte;
// tests/tokenizer/hf_oracle.mjs checks it on real vocabularies).
//
// Supported: BPE models (byte-level: GPT-2, Llama-3, Qwen2/3, GPT-4o; SentencePiece-style
// with byte fallback: Llama-2, Mistral), normalizers NFC/NFD/NFKC/NFKD, Lowercase,
// Prepend, Replace, Strip, StripAccents, Sequence; pre-tokenizers Split, ByteLevel,
// Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation, Sequence; decoders
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder, Sequence;
// post-processors TemplateProcessing, ByteLevel, Roberta/Bert, Sequence; added tokens
// with single_word/lstrip/rstrip/normalized/special. Anything else fails at load with
// an astrai::Error naming it.
//
// Thread safety: a loaded Tokenizer is immutable except for its internal word cache,
// which is synchronised; encode/decode may be called from many threads. Copies share
// the same loaded data.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"

namespace astrai::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

class Tokenizer {
 public:
  // `path`: a directory holding tokenizer.json (and optionally tokenizer_config.json,
  // chat_template.jinja), or the tokenizer.json file itself (its directory is searched
  // for tokenizer_config.json), or a GGUF model file (its metadata's vocabulary,
  // tokenizer/gguf_vocab.h). Throws astrai::Error with the file and reason.
  static Tokenizer load(const std::string& path);
  // From parsed JSON; `config` may be null (no special-token names, no chat template).
  static Tokenizer from_json(const Json& tokenizer_json, const Json& config = Json());

  // Text (UTF-8) to ids. Invalid UTF-8 throws astrai::Error naming the byte offset (the
  // official library only accepts valid strings); use utf8_lossy() first to replace
  // invalid bytes with U+FFFD the way Rust/JS decoders do. add_special_tokens applies
  // the post-processor (e.g. Llama-3's <|begin_of_text|>); special-token strings in
  // the text are always recognised as their ids, as in HF.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Encodes many texts in parallel (OpenMP); results in input order.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts,
                                                 bool add_special_tokens = true) const;
  // Ids to text through the decoder chain. Ids outside the vocabulary are skipped (as
  // HF does); skip_special_tokens drops added tokens marked special.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // The text one token adds after ordinary text, for per-token output (logprobs, echo):
  // decode({id}) except that decoders which strip the first token's leading space
  // (SentencePiece "▁word") keep it here, so the pieces of a sequence join into its text.
  // Computed as decode({a, id}) minus decode({a}) with a = the id of "a".
  std::string token_text(int32_t id) const;

  // Token string as stored in tokenizer.json (byte-level tokens in their Ġ form).
  std::optional<std::string> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // One past the largest id of the model vocab and added tokens (embedding rows needed).
  size_t vocab_size() const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

  // From tokenizer_config.json (-1 / empty when absent).
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  int32_t unk_id() const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& pad_token() const;
  // The tokens that end a turn, for every user of the idea (generation stops there; training
  // data ends an assistant span there): EOS, then the end-of-turn markers of the common chat
  // formats (<|im_end|>, <|eot_id|>, <|eom_id|>, <end_of_turn>, </s>, ...) that this vocabulary
  // has as special tokens; each once, in that order.
  struct TurnEnd {
    std::string text;
    int32_t id;
  };
  std::vector<TurnEnd> end_of_turn_tokens() const;
  // The default chat template (Jinja source), empty when none; named templates (a list
  // in tokenizer_config.json) are available through chat_template(name).
  const std::string& chat_template() const;
  std::optional<std::string> chat_template(const std::string& name) const;
  // tokenizer_config.json as loaded (null when absent).
  const Json& config() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  static Tokenizer from_json_checked(const Json& tokenizer_json, const Json& config);
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

// Copies the tokenizer's files (tokenizer.json, tokenizer_config.json, chat_template.jinja,
// special_tokens_map.json, those present) from `from` (a directory, or a tokenizer.json in
// it) into the directory `to`, next to weights written there; a file onto itself is skipped.
// From a GGUF model file: writes the tokenizer.json and tokenizer_config.json its metadata stands
// for (tokenizer/gguf_vocab.h). Empty `from`: nothing. Errors name the file.
void copy_tokenizer_files(const std::string& from, const std::string& to);

// Replaces each maximal invalid UTF-8 subpart with U+FFFD (Rust from_utf8_lossy,
// WHATWG TextDecoder); valid input is returned unchanged.
std::string utf8_lossy(std::string_view bytes);

}  // namespace astrai::tokenizer
