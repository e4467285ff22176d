// The stages of Hugging Face `tokenizers` between the text and the model, built from
// tokenizer.json: normalizers, pre-tokenizers, decoders and post-processors. Each
// reproduces the official semantics; an unsupported type is a load-time error naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/json.h"

namespace astrai::tokenizer {

// A compiled PCRE2 pattern (UTF + UCP + JIT). Oniguruma patterns (what HF uses) are
// translated where the two engines differ: \s/\S follow Unicode White_Space (PCRE2's
// \s lacks U+0085).
class Regex {
 public:
  explicit Regex(const std::string& onig_pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Calls fn(start, end) for each non-overlapping match, left to right.
  template <typename Fn>
  void for_each_match(std::string_view s, Fn&& fn) const {
    size_t pos = 0;
    size_t start = 0, end = 0;
    while (pos <= s.size() && next_match(s, pos, &start, &end)) {
      fn(start, end);
      // Empty match: step one character, as Rust/onig iterators do.
      pos = end > start ? end : end + step(s, end);
    }
  }

 private:
  bool next_match(std::string_view s, size_t pos, size_t* start, size_t* end) const;
  static size_t step(std::string_view s, size_t pos);
  void* code_ = nullptr;
};

// A string-or-regex pattern as in Split / Replace ({"String": ...} or {"Regex": ...}).
class Pattern {
 public:
  explicit Pattern(const Json& j, const std::string& where);
  // Appends (start, end, is_match) covering the whole of s (HF Pattern::find_matches).
  void find_matches(std::string_view s, std::vector<std::pair<std::pair<uint32_t, uint32_t>, bool>>& out) const;
  std::string replace_all(std::string_view s, std::string_view content) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(const Json& j);  // null -> identity
  std::string apply(std::string_view s) const;
  bool identity() const { return steps_.empty(); }

 private:
  struct Step {
    std::string type;
    std::string str;  // Prepend/Replace content
    std::shared_ptr<Pattern> pattern;
    bool left = false, right = false;
  };
  void add(const Json& j);
  std::vector<Step> steps_;
};

// Pre-tokenized pieces of one segment: ranges into `buf` (steps may rewrite buf).
struct Pieces {
  std::string buf;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(const Json& j);  // null -> whole segment is one word
  // first_segment: the segment starts at offset 0 of the input (Metaspace "first").
  void apply(std::string_view segment, bool first_segment, Pieces& out) const;
  // True when the chain ends with ByteLevel: the model then works on raw bytes.
  bool byte_level() const { return byte_level_; }

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace, kWhitespaceSplit, kWhitespace, kDigits, kPunctuation };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    Kind kind;
    std::shared_ptr<Pattern> pattern;
    std::shared_ptr<Regex> regex;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
    bool use_regex = false;
    std::string replacement;  // Metaspace
    int prepend = 0;          // Metaspace: 0 always, 1 first, 2 never
    bool split = true;
    bool individual = false;  // Digits
  };
  void add(const Json& j);
  static Behavior parse_behavior(const std::string& s, const std::string& where);
  void split_pieces(const Step& st, Pieces& p) const;
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

class Decoder {
 public:
  Decoder() = default;
  explicit Decoder(const Json& j);  // null -> tokens joined with " "
  std::string decode(std::vector<std::string> tokens) const;

 private:
  struct Step {
    std::string type;
    std::shared_ptr<Pattern> pattern;
    std::string content;
    char32_t ch = 0;
    size_t start = 0, stop = 0;
    int prepend = 0;
  };
  void add(const Json& j);
  std::vector<Step> steps_;
  bool none_ = true;
};

// Post-processor: which special ids surround the encoding when add_special_tokens.
class PostProcessor {
 public:
  PostProcessor() = default;
  PostProcessor(const Json& j, const std::function<std::optional<int32_t>(const std::string&)>& lookup);
  void apply(std::vector<int32_t>& ids) const;

 private:
  void add(const Json& j, const std::function<std::optional<int32_t>(const std::string&)>& lookup);
  std::vector<int32_t> prefix_, suffix_;
};

}  // namespace astrai::tokenizer
