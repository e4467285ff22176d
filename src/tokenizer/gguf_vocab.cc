#include "tokenizer/gguf_vocab.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "base/error.h"

namespace astrai::tokenizer {

namespace {

// llama.cpp's token types (llama_token_type).
enum TokenType : int { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// The pre-tokenizer regexes of the vocabularies that the supported tokenizer.ggml.pre names
// stand for (the same expressions those vocabularies' tokenizer.json files hold).
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4oRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Texts llama.cpp treats as control tokens that end generation whatever type the file gives them
// (end-of-turn and end-of-text markers of the common chat formats); a GGUF vocabulary matches them
// in text as special tokens for the same reason.
constexpr std::string_view kControlTexts[] = {
    "</s>", "<eos>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|endoftext|>", "<|end_of_text|>", "<|end|>",
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<end_of_turn>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_utterance>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["};

struct Vocab {
  const Json* tokens;
  std::vector<int> types;       // after the control-text rule
  std::vector<int> file_types;  // as the file gives them
  std::vector<double> scores;
};

const std::string& token(const Vocab& v, size_t id) { return (*v.tokens)[id].get_ref<const std::string&>(); }

Vocab read_vocab(const Json& meta, const std::string& where) {
  auto tokens = meta.find("tokenizer.ggml.tokens");
  if (tokens == meta.end() || !tokens->is_array() || tokens->empty())
    fail(where, ": GGUF has no tokenizer.ggml.tokens");
  Vocab v{&*tokens, std::vector<int>(tokens->size(), kNormal), {}, {}};
  for (const auto& t : *tokens)
    if (!t.is_string()) fail(where, ": tokenizer.ggml.tokens must hold strings");
  if (auto it = meta.find("tokenizer.ggml.token_type"); it != meta.end()) {
    if (!it->is_array() || it->size() != tokens->size())
      fail(where, ": tokenizer.ggml.token_type must have one entry per token");
    for (size_t i = 0; i < it->size(); ++i) v.types[i] = (*it)[i].get<int>();
  }
  v.file_types = v.types;
  for (size_t i = 0; i < tokens->size(); ++i)
    if (std::find(std::begin(kControlTexts), std::end(kControlTexts), token(v, i)) != std::end(kControlTexts))
      v.types[i] = kControl;
  if (auto it = meta.find("tokenizer.ggml.scores"); it != meta.end()) {
    if (!it->is_array() || it->size() != tokens->size())
      fail(where, ": tokenizer.ggml.scores must have one entry per token");
    for (const auto& s : *it) v.scores.push_back(s.get<double>());
  }
  return v;
}

Json added_token(int64_t id, const std::string& content, bool special) {
  return {{"id", id},       {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

int64_t meta_id(const Json& meta, const char* key) {
  auto it = meta.find(key);
  return it != meta.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

bool meta_bool(const Json& meta, const char* key, bool fallback) {
  auto it = meta.find(key);
  return it != meta.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string model_type(const Json& meta, const std::string& where) {
  auto it = meta.find("tokenizer.ggml.model");
  if (it == meta.end() || !it->is_string()) fail(where, ": GGUF has no tokenizer.ggml.model");
  const std::string m = it->get<std::string>();
  if (m != "gpt2" && m != "llama")
    fail(where, ": GGUF tokenizer model \"", m, "\" is not supported (gpt2: byte-level BPE, llama: SentencePiece)");
  return m;
}

std::string pre_name(const Json& meta) {
  auto it = meta.find("tokenizer.ggml.pre");
  return it != meta.end() && it->is_string() ? it->get<std::string>() : "";
}

bool is_llama3_pre(const std::string& pre) { return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3"; }

// "smaug-bpe": what llama.cpp's converter names Llama-3's vocabulary when its tokenizer.json adds no
// BOS (its hash of the ids differs): llama.cpp gives it Llama-3's regex, but neither Llama-3's
// ignore_merges nor its default BOS.
bool has_llama3_regex(const std::string& pre) { return is_llama3_pre(pre) || pre == "smaug-bpe"; }

Json split_then_byte_level(std::string_view regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", std::string(regex)}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
}

Json byte_level_pre_tokenizer(const std::string& pre, const std::string& where) {
  if (pre == "gpt-2")
    return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}};
  if (has_llama3_regex(pre)) return split_then_byte_level(kLlama3Regex);
  if (pre == "qwen2") return split_then_byte_level(kQwen2Regex);
  if (pre == "gpt-4o" || pre == "llama4") return split_then_byte_level(kGpt4oRegex);
  fail(where, ": GGUF pre-tokenizer \"", pre.empty() ? "(none: llama.cpp's default)" : pre,
       "\" is not supported (gpt-2, llama-bpe, smaug-bpe, qwen2, gpt-4o)");
}

// SentencePiece merges: every split of a normal piece into two vocabulary pieces, the pieces whose
// score is highest first (ties: lower id first).
Json spm_merges(const Vocab& v) {
  std::unordered_map<std::string_view, size_t> id;
  for (size_t i = 0; i < v.tokens->size(); ++i) id.emplace(token(v, i), i);
  struct Merge {
    size_t product, left, right;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < v.tokens->size(); ++i) {
    if (v.types[i] != kNormal && v.types[i] != kUserDefined) continue;
    const std::string& t = token(v, i);
    for (size_t k = 1; k < t.size(); ++k) {
      if ((static_cast<unsigned char>(t[k]) & 0xC0) == 0x80) continue;  // inside a UTF-8 character
      auto a = id.find(std::string_view(t).substr(0, k));
      auto b = id.find(std::string_view(t).substr(k));
      if (a != id.end() && b != id.end()) merges.push_back({i, a->second, b->second});
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [&](const Merge& x, const Merge& y) {
    const double sx = v.scores[x.product], sy = v.scores[y.product];
    return sx != sy ? sx > sy : x.product < y.product;
  });
  Json out = Json::array();
  for (const auto& m : merges) out.push_back({token(v, m.left), token(v, m.right)});
  return out;
}

Json post_processor(const Json& meta, const Vocab& v, bool add_bos, bool add_eos, const std::string& where) {
  const int64_t bos = meta_id(meta, "tokenizer.ggml.bos_token_id");
  const int64_t eos = meta_id(meta, "tokenizer.ggml.eos_token_id");
  const auto n = static_cast<int64_t>(v.tokens->size());
  if ((add_bos && (bos < 0 || bos >= n)) || (add_eos && (eos < 0 || eos >= n)))
    fail(where, ": the GGUF asks to add BOS/EOS but its token id is missing or out of range");
  if (!add_bos && !add_eos) return nullptr;
  Json specials = Json::object();
  auto special = [&](int64_t id) {
    const std::string& text = token(v, static_cast<size_t>(id));
    specials[text] = {{"id", text}, {"ids", {id}}, {"tokens", {text}}};
    return Json{{"SpecialToken", {{"id", text}, {"type_id", 0}}}};
  };
  auto sequence = [&](const char* id) {
    Json out = Json::array();
    if (add_bos) out.push_back(special(bos));
    out.push_back({{"Sequence", {{"id", id}, {"type_id", 0}}}});
    if (add_eos) out.push_back(special(eos));
    return out;
  };
  const Json single = sequence("A");
  Json pair = single;
  for (const auto& e : sequence("B")) pair.push_back(e);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
}

}  // namespace

Json gguf_tokenizer_json(const Json& meta, const std::string& where) {
  const std::string model = model_type(meta, where);
  const Vocab v = read_vocab(meta, where);
  const bool spm = model == "llama";
  if (spm && v.scores.empty()) fail(where, ": a SentencePiece GGUF vocabulary needs tokenizer.ggml.scores");
  Json vocab = Json::object(), added = Json::array();
  for (size_t i = 0; i < v.tokens->size(); ++i) {
    const int type = v.types[i];
    const bool special = type == kControl || type == kUnknown;
    if (special || type == kUserDefined) added.push_back(added_token(static_cast<int64_t>(i), token(v, i), special));
    // Byte-level vocabularies keep the file's added tokens out of the BPE model (their text is not
    // byte-level); a normal token made control by its text stays, merges may produce it.
    const int file_type = v.file_types[i];
    if (spm || (file_type != kControl && file_type != kUnknown && file_type != kUserDefined)) vocab[token(v, i)] = i;
  }
  Json j;
  j["version"] = "1.0";
  j["added_tokens"] = added;
  const bool add_bos = meta_bool(meta, "tokenizer.ggml.add_bos_token", spm || is_llama3_pre(pre_name(meta)));
  const bool add_eos = meta_bool(meta, "tokenizer.ggml.add_eos_token", false);
  j["post_processor"] = post_processor(meta, v, add_bos, add_eos, where);
  if (spm) {
    const bool prefix = meta_bool(meta, "tokenizer.ggml.add_space_prefix", true);
    Json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
    j["normalizer"] = prefix ? Json{{"type", "Sequence"},
                                    {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}}, replace}}}
                             : replace;
    j["pre_tokenizer"] = nullptr;
    Json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
    int64_t unk = meta_id(meta, "tokenizer.ggml.unknown_token_id");
    if (unk < 0) unk = 0;  // llama.cpp's default for SentencePiece vocabularies
    j["model"] = {{"type", "BPE"},
                  {"vocab", vocab},
                  {"merges", spm_merges(v)},
                  {"unk_token", unk >= 0 && unk < static_cast<int64_t>(v.tokens->size()) ? Json(token(v, unk)) : Json()},
                  {"fuse_unk", true},
                  {"byte_fallback", true}};
  } else {
    auto merges = meta.find("tokenizer.ggml.merges");
    if (merges == meta.end() || !merges->is_array()) fail(where, ": a byte-level GGUF vocabulary needs tokenizer.ggml.merges");
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = byte_level_pre_tokenizer(pre_name(meta), where);
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
    j["model"] = {{"type", "BPE"},
                  {"vocab", vocab},
                  {"merges", *merges},
                  {"ignore_merges", is_llama3_pre(pre_name(meta))},
                  {"fuse_unk", false},
                  {"byte_fallback", false}};
  }
  return j;
}

Json gguf_tokenizer_config(const Json& meta, const std::string& where) {
  const Vocab v = read_vocab(meta, where);
  Json c = Json::object();
  const auto n = static_cast<int64_t>(v.tokens->size());
  for (auto [key, name] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token"},
                           std::pair{"tokenizer.ggml.eos_token_id", "eos_token"},
                           std::pair{"tokenizer.ggml.unknown_token_id", "unk_token"},
                           std::pair{"tokenizer.ggml.padding_token_id", "pad_token"}}) {
    const int64_t id = meta_id(meta, key);
    if (id >= 0 && id < n) c[name] = token(v, static_cast<size_t>(id));
  }
  const std::string spm_or_bpe = model_type(meta, where);
  c["add_bos_token"] = meta_bool(meta, "tokenizer.ggml.add_bos_token", spm_or_bpe == "llama" || is_llama3_pre(pre_name(meta)));
  Json named = Json::array();
  const std::string prefix = "tokenizer.chat_template.";
  for (auto it = meta.begin(); it != meta.end(); ++it) {
    if (it.key() == "tokenizer.chat_template" && it->is_string()) named.push_back({{"name", "default"}, {"template", *it}});
    if (it.key().rfind(prefix, 0) == 0 && it->is_string())
      named.push_back({{"name", it.key().substr(prefix.size())}, {"template", *it}});
  }
  if (named.size() == 1 && named[0]["name"] == "default") c["chat_template"] = named[0]["template"];
  else if (!named.empty()) c["chat_template"] = named;
  return c;
}

}  // namespace astrai::tokenizer
