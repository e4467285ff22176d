#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>

#include "tokenizer/unicode.h"

namespace astrai::tokenizer {

const std::array<char32_t, 256>& byte_to_char_table() {
  static const std::array<char32_t, 256> table = [] {
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other
    // 68 bytes to U+0100 + n in byte order.
    std::array<char32_t, 256> t{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = keep ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
    return t;
  }();
  return table;
}

namespace {
int char_to_byte(char32_t c) {
  static const std::array<int16_t, 324> rev = [] {
    std::array<int16_t, 324> r;
    r.fill(-1);
    const auto& t = byte_to_char_table();
    for (int b = 0; b < 256; ++b) r[t[b]] = static_cast<int16_t>(b);
    return r;
  }();
  return c < rev.size() ? rev[c] : -1;
}
}  // namespace

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    int b = char_to_byte(utf8_next(token, i));
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  const auto& t = byte_to_char_table();
  for (char c : bytes) utf8_append(out, t[static_cast<uint8_t>(c)]);
  return out;
}

// Open-addressing map (id_a, id_b) -> (rank, new_id): the merge lookup is the hot path.
struct Bpe::PairMap {
  struct Slot {
    uint64_t key = ~0ull;
    int32_t rank = 0;
    int32_t new_id = 0;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;
  int shift = 64;

  explicit PairMap(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots.assign(cap, Slot{});
    mask = cap - 1;
    shift = 64 - __builtin_ctzll(cap);
  }
  static uint64_t key_of(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t home(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift; }
  // Later duplicates overwrite earlier ones, as HF's HashMap collect does.
  void put(int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t key = key_of(a, b);
    for (size_t i = home(key);; i = (i + 1) & mask) {
      if (slots[i].key == key || slots[i].key == ~0ull) {
        slots[i] = Slot{key, rank, new_id};
        return;
      }
    }
  }
  const Slot* get(int32_t a, int32_t b) const {
    uint64_t key = key_of(a, b);
    for (size_t i = home(key);; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == ~0ull) return nullptr;
    }
  }
};

// Word cache, sharded so concurrent encoders (OpenMP data preprocessing, server
// threads) rarely contend. Bounded: once a shard is full it stops caching.
struct Bpe::Cache {
  static constexpr size_t kShards = 64;
  static constexpr size_t kMaxPerShard = 16384;
  static constexpr size_t kMaxWordBytes = 256;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards;
};

Bpe::Bpe(const Json& model, bool byte_level) : byte_level_(byte_level), cache_(std::make_unique<Cache>()) {
  const std::string where = "tokenizer.json model";
  std::string type = json_optional<std::string>(model, "type", "BPE", where);
  if (type != "BPE") fail(where, ": model type \"", type, "\" is not supported (only BPE)");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
    fail(where, ": BPE dropout is not supported (it makes encoding random)");
  auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object()) fail(where, ": missing \"vocab\" object");
  int32_t max_id = -1;
  vocab_.reserve(vit->size());
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it.value().is_number_integer()) fail(where, ": vocab entry \"", it.key(), "\" has a non-integer id");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX) fail(where, ": vocab id ", id, " out of range");
    vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, static_cast<int32_t>(id));
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : vocab_) id_to_token_[id] = tok;

  unk_id_.reset();
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto u = vocab_.find(model["unk_token"].get<std::string>());
    if (u == vocab_.end()) fail(where, ": unk_token \"", model["unk_token"].get<std::string>(), "\" is not in the vocab");
    unk_id_ = u->second;
  }
  fuse_unk_ = json_optional<bool>(model, "fuse_unk", false, where);
  byte_fallback_ = json_optional<bool>(model, "byte_fallback", false, where);
  ignore_merges_ = json_optional<bool>(model, "ignore_merges", false, where);
  prefix_ = json_optional<std::string>(model, "continuing_subword_prefix", "", where);
  suffix_ = json_optional<std::string>(model, "end_of_word_suffix", "", where);

  if (byte_level_) {
    unit_vocab_.reserve(vocab_.size());
    for (const auto& [tok, id] : vocab_) {
      // Tokens outside the byte-level alphabet can never be produced from bytes; they
      // stay decodable through id_to_token_.
      if (auto bytes = byte_level_to_bytes(tok)) unit_vocab_.emplace(std::move(*bytes), id);
    }
    auto p = byte_level_to_bytes(prefix_), s = byte_level_to_bytes(suffix_);
    if (!p || !s) fail(where, ": continuing_subword_prefix/end_of_word_suffix outside the byte-level alphabet");
    prefix_ = *p;
    suffix_ = *s;
  }
  const Vocab& units = byte_level_ ? unit_vocab_ : vocab_;
  for (int b = 0; b < 256; ++b) {
    auto it = units.find(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = it == units.end() ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto f = vocab_.find(std::string_view(name));
    fallback_ids_[b] = f == vocab_.end() ? -1 : f->second;
  }

  auto mit = model.find("merges");
  size_t n_merges = (mit != model.end() && mit->is_array()) ? mit->size() : 0;
  merges_ = std::make_unique<PairMap>(n_merges);
  for (size_t rank = 0; rank < n_merges; ++rank) {
    const Json& m = (*mit)[rank];
    std::string a, b;
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        fail(where, ": merge ", rank, " \"", line, "\" is not two space-separated tokens");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail(where, ": merge ", rank, " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end())
      fail(where, ": merge ", rank, " (\"", a, "\", \"", b, "\") uses a token not in the vocab");
    std::string merged = a;
    // With a continuing-subword prefix, "a" + "##b" merges to "a" + "b" (as HF does).
    std::string_view rhs = b;
    std::string raw_prefix = json_optional<std::string>(model, "continuing_subword_prefix", "", where);
    if (!raw_prefix.empty() && rhs.substr(0, raw_prefix.size()) == raw_prefix) rhs.remove_prefix(raw_prefix.size());
    merged += rhs;
    auto in = vocab_.find(merged);
    if (in == vocab_.end()) fail(where, ": merge ", rank, " result \"", merged, "\" is not in the vocab");
    merges_->put(ia->second, ib->second, static_cast<int32_t>(rank), in->second);
  }
}

Bpe::~Bpe() = default;

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  const std::string& s = id_to_token_[id];
  if (s.empty()) {
    // A hole in the id range (or the empty token, which no vocab uses).
    auto it = vocab_.find(std::string_view());
    if (it == vocab_.end() || it->second != id) return nullptr;
  }
  return &s;
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const Vocab& units = byte_level_ ? unit_vocab_ : vocab_;
  bool cacheable = word.size() < Cache::kMaxWordBytes;
  Cache::Shard* shard = nullptr;
  if (cacheable) {
    shard = &cache_->shards[StringHash{}(word) % Cache::kShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->map.find(word);
    if (it != shard->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  auto whole = ignore_merges_ ? units.find(word) : units.end();
  if (whole != units.end()) {
    out.push_back(whole->second);
  } else {
    merge_word(word, out);
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->map.size() < Cache::kMaxPerShard)
      shard->map.emplace(std::string(word), std::vector<int32_t>(out.begin() + start, out.end()));
  }
}

namespace {
struct Sym {
  int32_t id;
  int32_t prev, next;
  int32_t rank;    // rank of the merge (this, next); INT32_MAX when none
  int32_t new_id;  // its result
  bool alive;
};
}  // namespace

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<Sym> syms;
  syms.clear();
  const Vocab& units = byte_level_ ? unit_vocab_ : vocab_;
  auto add = [&](int32_t id) { syms.push_back(Sym{id, 0, 0, INT32_MAX, 0, true}); };
  std::optional<int32_t> pending_unk = std::nullopt;  // fused unk waiting to be added (HF order)
  bool plain = prefix_.empty() && suffix_.empty();
  std::string unit;
  size_t i = 0;
  while (i < word.size()) {
    size_t len = byte_level_ ? 1 : utf8_len(static_cast<uint8_t>(word[i]));
    if (i + len > word.size()) len = word.size() - i;
    size_t end = i + len;
    int32_t id = -1;
    std::string_view u = word.substr(i, len);
    if (plain && len == 1) {
      id = byte_ids_[static_cast<uint8_t>(word[i])];
    } else {
      unit.clear();
      if (i > 0) unit += prefix_;
      unit += u;
      if (end == word.size()) unit += suffix_;
      auto it = units.find(unit);
      if (it != units.end()) id = it->second;
      if (!plain) u = unit;
    }
    i = end;
    if (id >= 0) {
      if (pending_unk) {
        add(*pending_unk);
        pending_unk.reset();
      }
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : u) all = all && fallback_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : u) add(fallback_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) add(*pending_unk);
      pending_unk = *unk_id_;
    }
    // No unk token: HF drops the character.
  }
  if (pending_unk) add(*pending_unk);

  const int32_t n = static_cast<int32_t>(syms.size());
  if (n == 0) return;  // every character dropped (no unk token, no byte fallback)
  for (int32_t k = 0; k < n; ++k) {
    syms[k].prev = k - 1;
    syms[k].next = k + 1 < n ? k + 1 : -1;
  }
  auto rank_pair = [&](int32_t k) {
    Sym& s = syms[k];
    s.rank = INT32_MAX;
    if (s.next < 0) return;
    if (const PairMap::Slot* m = merges_->get(s.id, syms[s.next].id)) {
      s.rank = m->rank;
      s.new_id = m->new_id;
    }
  };
  for (int32_t k = 0; k < n; ++k) rank_pair(k);
  auto merge_at = [&](int32_t k) {
    Sym& s = syms[k];
    int32_t r = s.next;
    s.id = s.new_id;
    s.next = syms[r].next;
    syms[r].alive = false;
    if (s.next >= 0) syms[s.next].prev = k;
  };

  if (n <= 64) {
    // Short words: scan for the lowest (rank, position) pair; the cached ranks make each
    // scan a pass over ints. Equivalent to the heap: both pick the global minimum.
    for (;;) {
      int32_t best = -1, best_rank = INT32_MAX;
      for (int32_t k = 0; k >= 0; k = syms[k].next) {
        if (syms[k].rank < best_rank) {
          best_rank = syms[k].rank;
          best = k;
        }
      }
      if (best < 0) break;
      merge_at(best);
      rank_pair(best);
      if (syms[best].prev >= 0) rank_pair(syms[best].prev);
    }
  } else {
    struct Entry {
      int32_t rank, pos, new_id;
      bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (int32_t k = 0; k < n; ++k)
      if (syms[k].rank != INT32_MAX) heap.push({syms[k].rank, k, syms[k].new_id});
    while (!heap.empty()) {
      Entry e = heap.top();
      heap.pop();
      Sym& s = syms[e.pos];
      // Stale entries: the left symbol merged away, or the pair changed since.
      if (!s.alive || s.next < 0 || s.rank != e.rank || s.new_id != e.new_id) continue;
      merge_at(e.pos);
      rank_pair(e.pos);
      if (s.rank != INT32_MAX) heap.push({s.rank, e.pos, s.new_id});
      if (s.prev >= 0) {
        rank_pair(s.prev);
        if (syms[s.prev].rank != INT32_MAX) heap.push({syms[s.prev].rank, s.prev, syms[s.prev].new_id});
      }
    }
  }
  for (int32_t k = n > 0 ? 0 : -1; k >= 0; k = syms[k].next) out.push_back(syms[k].id);
}

}  // namespace astrai::tokenizer
