// What `eval perplexity` reads: one stream of token ids, and the UTF-8 bytes its scored tokens
// stand for (the denominator of bits per byte).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "eval/perplexity.h"

namespace astrai::tokenizer {
class Tokenizer;
}

namespace astrai::eval {

// `path` is either a text file, encoded whole with the tokenizer's defaults (special tokens
// added, e.g. a BOS for tokenizers whose post-processor adds one, as `astrai tokenize` does),
// or a dataset directory made by `astrai preprocess`, whose `sequence` key is read as one flat
// stream across its records. Ids are checked against vocab_size. A dataset with padding (packed
// with --seq-len) is refused: padding is not text.
std::vector<int32_t> load_token_stream(const std::string& path, const tokenizer::Tokenizer& tok, int64_t vocab_size);

// UTF-8 bytes of the scored tokens of `windows`: the stream is decoded once, token by token,
// special tokens skipped (a BOS or EOS is no text), and each token counts the bytes the
// decoder emits when it arrives (a character split over several byte tokens counts once, at
// the token that completes it). The bytes of all tokens sum to tokenizer.decode(ids, true).
int64_t scored_bytes(const tokenizer::Tokenizer& tok, std::span<const int32_t> ids, const std::vector<Window>& windows);

}  // namespace astrai::eval
