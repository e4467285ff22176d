#include "eval/token_stream.h"

#include <filesystem>

#include "base/error.h"
#include "base/files.h"
#include "data/shard.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace astrai::eval {

namespace {

std::vector<int32_t> shard_stream(const std::string& dir, int64_t vocab_size) {
  const data::Shards shards = data::Shards::open(dir);
  ASTRAI_CHECK(shards.has("sequence"), dir, ": the dataset has no \"sequence\" key (keys: ",
               Json(shards.key_names()).dump(), "); perplexity reads language-model datasets");
  const Json& meta = shards.meta();
  if (meta.contains("packing") && meta["packing"].value("padding", int64_t{0}) > 0)
    fail(dir, ": the dataset holds ", meta["packing"]["padding"].get<int64_t>(),
         " padding tokens (packed with --seq-len); preprocess the text with --packing none for perplexity");
  shards.check_vocab(vocab_size);
  const data::ShardKey& key = shards.key("sequence");
  std::vector<int32_t> ids(static_cast<size_t>(key.length));
  key.read_i32(0, key.length, ids.data());
  return ids;
}

std::vector<int32_t> text_stream(const std::string& path, const tokenizer::Tokenizer& tok, int64_t vocab_size) {
  std::vector<int32_t> ids = tok.encode(read_file(path), /*add_special_tokens=*/true);
  for (size_t i = 0; i < ids.size(); ++i)
    ASTRAI_CHECK(ids[i] < vocab_size, path, ": token ", i, " has id ", ids[i],
                 ", outside the model's vocabulary of ", vocab_size, " (a tokenizer for another model?)");
  return ids;
}

}  // namespace

std::vector<int32_t> load_token_stream(const std::string& path, const tokenizer::Tokenizer& tok, int64_t vocab_size) {
  ASTRAI_CHECK(std::filesystem::exists(path), "--data ", path, ": no such file or directory");
  if (std::filesystem::is_directory(path)) return shard_stream(path, vocab_size);
  return text_stream(path, tok, vocab_size);
}

int64_t scored_bytes(const tokenizer::Tokenizer& tok, std::span<const int32_t> ids, const std::vector<Window>& windows) {
  tokenizer::StreamDecoder decoder(tok, /*skip_special_tokens=*/true);
  int64_t total = 0;
  size_t w = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    int64_t bytes = static_cast<int64_t>(decoder.step(ids[t]).size());
    if (t + 1 == ids.size()) bytes += static_cast<int64_t>(decoder.flush().size());
    const auto pos = static_cast<int64_t>(t);
    while (w < windows.size() && windows[w].end <= pos) ++w;  // windows are ordered and disjoint in scoring
    if (w < windows.size() && pos >= windows[w].first) total += bytes;
  }
  return total;
}

}  // namespace astrai::eval
