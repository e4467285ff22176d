#include "tokenizer/trainer.h"

#include <algorithm>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include "base/files.h"
#include "base/log.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace astrai::tokenizer {

namespace {
// Qwen2's split pattern: single digits, so arithmetic stays per-digit.
constexpr const char* kSplitPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

Json byte_level_json() {
  return Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

Json pre_tokenizer_json() {
  return Json{{"type", "Sequence"},
              {"pretokenizers",
               Json::array({Json{{"type", "Split"},
                                 {"pattern", Json{{"Regex", kSplitPattern}}},
                                 {"behavior", "Isolated"},
                                 {"invert", false}},
                            byte_level_json()})}};
}

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
}  // namespace

const std::vector<std::string>& default_special_tokens() {
  static const std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return tokens;
}

const std::string& chatml_template() {
  static const std::string t =
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  return t;
}

Json train_bpe(const std::vector<std::string>& texts, const TrainerOptions& options) {
  std::vector<std::string> specials = default_special_tokens();
  for (const auto& s : options.special_tokens) {
    if (s.empty()) fail("tokenizer train: empty special token");
    if (std::find(specials.begin(), specials.end(), s) == specials.end()) specials.push_back(s);
  }
  const size_t base = specials.size() + 256;
  if (options.vocab_size < base)
    fail("tokenizer train: --vocab-size ", options.vocab_size, " is below the ", base,
         " special and byte tokens");

  // 1. Word counts. Special-token strings are cut out first (they are never merged into).
  PreTokenizer pre(pre_tokenizer_json());
  std::unordered_map<std::string, uint64_t> counts;
  Pieces pieces;
  auto count_text = [&](std::string_view text) {
    pre.apply(text, true, pieces);
    for (auto [a, b] : pieces.ranges) ++counts[pieces.buf.substr(a, b - a)];
  };
  for (const std::string& raw : texts) {
    std::string text = utf8_lossy(raw);
    std::string_view rest = text;
    while (!rest.empty()) {
      size_t best = std::string_view::npos, len = 0;
      for (const auto& s : specials) {
        size_t at = rest.find(s);
        if (at < best || (at == best && s.size() > len)) best = at, len = s.size();
      }
      if (best == std::string_view::npos) {
        count_text(rest);
        break;
      }
      count_text(rest.substr(0, best));
      rest.remove_prefix(best + len);
    }
  }

  // 2. Words as symbol sequences, sorted so ids and iteration order are deterministic.
  std::vector<std::pair<std::string, uint64_t>> sorted(counts.begin(), counts.end());
  counts.clear();
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> token_bytes;  // id -> raw bytes (specials: their text)
  for (const auto& s : specials) token_bytes.push_back(s);
  for (int b = 0; b < 256; ++b) token_bytes.push_back(std::string(1, char(b)));
  std::unordered_map<std::string, int32_t> bytes_to_id;
  for (int b = 0; b < 256; ++b) bytes_to_id[token_bytes[specials.size() + b]] = int32_t(specials.size() + b);

  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<uint64_t> freq(sorted.size());
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  for (size_t w = 0; w < sorted.size(); ++w) {
    freq[w] = sorted[w].second;
    for (char c : sorted[w].first) words[w].push_back(int32_t(specials.size() + uint8_t(c)));
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t k = pair_key(words[w][i], words[w][i + 1]);
      pair_count[k] += int64_t(freq[w]);
      auto& v = where[k];
      if (v.empty() || v.back() != int32_t(w)) v.push_back(int32_t(w));
    }
  }
  sorted.clear();

  // 3. Merges, most frequent first; heap entries are lazily invalidated.
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Entry> heap;
  for (const auto& [k, c] : pair_count)
    if (c > 0) heap.push({c, k});
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<uint32_t> stamp(words.size(), 0);
  uint32_t epoch = 0;
  std::vector<uint64_t> touched;
  size_t vocab = base;
  while (vocab < options.vocab_size && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    auto pc = pair_count.find(top.key);
    if (pc == pair_count.end() || pc->second != top.count) continue;  // stale
    if (uint64_t(top.count) < options.min_frequency) break;
    int32_t a = int32_t(top.key >> 32), b = int32_t(top.key & 0xFFFFFFFF);
    std::string merged = token_bytes[a] + token_bytes[b];
    int32_t c;
    auto existing = bytes_to_id.find(merged);
    if (existing != bytes_to_id.end()) {
      c = existing->second;
    } else {
      c = int32_t(token_bytes.size());
      token_bytes.push_back(merged);
      bytes_to_id.emplace(std::move(merged), c);
      ++vocab;
    }
    merges.push_back({a, b});
    ++epoch;
    touched.clear();
    std::vector<int32_t> affected = std::move(where[top.key]);
    where.erase(top.key);
    auto bump = [&](int32_t x, int32_t y, int64_t d, int32_t w) {
      uint64_t k = pair_key(x, y);
      pair_count[k] += d;
      touched.push_back(k);
      if (d > 0) {
        auto& v = where[k];
        if (v.empty() || v.back() != w) v.push_back(w);
      }
    };
    for (int32_t w : affected) {
      if (stamp[w] == epoch) continue;
      stamp[w] = epoch;
      auto& syms = words[w];
      int64_t f = int64_t(freq[w]);
      bool has = false;
      for (size_t i = 0; i + 1 < syms.size(); ++i)
        if (syms[i] == a && syms[i + 1] == b) has = true;
      if (!has) continue;
      for (size_t i = 0; i + 1 < syms.size(); ++i) bump(syms[i], syms[i + 1], -f, w);
      std::vector<int32_t> next;
      next.reserve(syms.size());
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          next.push_back(c);
          ++i;
        } else {
          next.push_back(syms[i]);
        }
      }
      syms = std::move(next);
      for (size_t i = 0; i + 1 < syms.size(); ++i) bump(syms[i], syms[i + 1], f, w);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      auto it = pair_count.find(k);
      if (it->second <= 0) {
        pair_count.erase(it);
      } else if (k != top.key) {
        heap.push({it->second, k});
      }
    }
    if (options.progress && merges.size() % 1000 == 0)
      log_info("tokenizer train: ", merges.size(), " merges, vocab ", vocab);
  }

  // 4. tokenizer.json
  Json vocab_json = Json::object();
  for (size_t id = specials.size(); id < token_bytes.size(); ++id)
    vocab_json[bytes_to_byte_level(token_bytes[id])] = int32_t(id);
  for (size_t id = 0; id < specials.size(); ++id) vocab_json[specials[id]] = int32_t(id);
  Json merges_json = Json::array();
  for (auto [a, b] : merges)
    merges_json.push_back(Json::array({bytes_to_byte_level(token_bytes[a]), bytes_to_byte_level(token_bytes[b])}));
  Json added = Json::array();
  for (size_t id = 0; id < specials.size(); ++id)
    added.push_back(Json{{"id", int32_t(id)},
                         {"content", specials[id]},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
  Json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", std::move(vocab_json)},
                {"merges", std::move(merges_json)}};
  return Json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", std::move(added)},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer_json()},
              {"post_processor", byte_level_json()},
              {"decoder", byte_level_json()},
              {"model", std::move(model)}};
}

Json train_bpe_files(const std::vector<std::string>& paths, const TrainerOptions& options) {
  if (paths.empty()) fail("tokenizer train: no input files");
  std::vector<std::string> texts;
  for (const auto& p : paths) texts.push_back(read_file(p));
  return train_bpe(texts, options);
}

Json trained_tokenizer_config() {
  return Json{{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"bos_token", "<|endoftext|>"},
              {"eos_token", "<|im_end|>"},
              {"pad_token", "<|endoftext|>"},
              {"unk_token", nullptr},
              {"add_bos_token", false},
              {"add_eos_token", false},
              {"clean_up_tokenization_spaces", false},
              {"model_max_length", 131072},
              {"chat_template", chatml_template()}};
}

void save_trained_tokenizer(const std::string& dir, const Json& tokenizer_json) {
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/tokenizer.json", tokenizer_json.dump(1) + "\n");
  write_file_atomic(dir + "/tokenizer_config.json", trained_tokenizer_config().dump(2) + "\n");
}

}  // namespace astrai::tokenizer
