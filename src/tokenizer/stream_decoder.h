// StreamDecoder: turns a growing token sequence into text deltas for streaming output.
//
// Invariants: the concatenation of all deltas plus flush() equals tokenizer.decode(all
// ids) for the decoders real tokenizers use, whenever the ids decode to valid UTF-8 (an
// invalid byte-fallback run becomes all U+FFFD in decode(), retroactively; the stream
// cannot retract what it showed, so there it may show fewer U+FFFD); a delta never ends inside a UTF-8
// character (text whose decoding still ends in U+FFFD is held back until the character
// completes); each step decodes only a small window — the tokens of the previous
// emission (as context, so SentencePiece leading-space stripping and byte-fallback
// groups come out right) plus the pending ones — so work per token is O(1) amortised.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace astrai::tokenizer {

class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special_tokens = false);

  // Feeds one token; returns the newly completed text (often empty while a multi-byte
  // character is still incomplete).
  std::string step(int32_t id);
  std::string step(std::span<const int32_t> ids);
  // End of stream: returns held-back text (an incomplete character becomes U+FFFD).
  std::string flush();
  // Starts a new sequence.
  void reset();

 private:
  // Tokens adding no text are carried at most this many steps.
  static constexpr size_t kMaxPending = 8;
  // Text ending in U+FFFD (possibly an incomplete character) is held back; after this
  // many pending tokens (a run of real U+FFFD) it is released, so work stays bounded.
  static constexpr size_t kForceAdvance = 64;
  Tokenizer tokenizer_;
  bool skip_special_;
  std::vector<int32_t> window_;  // context tokens, then pending tokens
  size_t context_ = 0;           // how many leading tokens of window_ are context
  std::string context_text_;     // decode(window_[0, context_))
  size_t emitted_ = 0;           // bytes after context_text_ already returned
};

}  // namespace astrai::tokenizer
