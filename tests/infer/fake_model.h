// Deterministic stand-ins for a model and a tokenizer, to test the engine's bookkeeping.
//
// FakeModel's logits for a row are a pseudo-random function of the whole token sequence up to
// that row, computed by reading every earlier token back from the paged KV cache through the
// page table (K holds (token, position) in every layer). Any paging bug (wrong page, wrong
// slot, a slot never written, a stale or shared page overwritten, positions mixed between
// sequences) changes the logits or trips a check; reference_logits() computes the same thing
// from the plain token list (what "full recomputation" means for this model).
#pragma once

#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "infer/backend.h"

namespace astrai::infer::testing {

inline uint64_t fake_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Logits of the next token after `prefix_hash`; a few tokens can be made more likely.
inline void fake_logits(uint64_t h, int32_t vocab, float* out) {
  for (int32_t v = 0; v < vocab; ++v) {
    const uint64_t r = fake_mix(h ^ (uint64_t(v) * 0x100000001b3ull));
    out[v] = static_cast<float>((r >> 11) * 0x1.0p-53) * 8.0f - 4.0f;
  }
}

inline uint64_t fake_hash_step(uint64_t h, int32_t token) { return fake_mix(h ^ (uint64_t(token) + 1)); }

inline std::vector<float> reference_logits(const std::vector<int32_t>& tokens, int32_t vocab) {
  uint64_t h = 0;
  for (int32_t t : tokens) h = fake_hash_step(h, t);
  std::vector<float> out(vocab);
  fake_logits(h, vocab, out.data());
  return out;
}

// Greedy continuation by full recomputation.
inline std::vector<int32_t> reference_greedy(std::vector<int32_t> tokens, int32_t vocab, int32_t n,
                                             const std::vector<int32_t>& stop = {}) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    auto l = reference_logits(tokens, vocab);
    int32_t best = 0;
    for (int32_t v = 1; v < vocab; ++v)
      if (l[v] > l[best]) best = v;
    out.push_back(best);
    tokens.push_back(best);
    if (std::find(stop.begin(), stop.end(), best) != stop.end()) break;
  }
  return out;
}

class FakeModel : public ForwardBackend {
 public:
  explicit FakeModel(int32_t vocab = 300, int32_t max_context = 4096, std::vector<int32_t> eos = {}) {
    info_.vocab_size = vocab;
    info_.num_layers = 2;
    info_.num_kv_heads = 1;
    info_.k_head_dim = 2;
    info_.v_head_dim = 2;
    info_.max_context = max_context;
    info_.eos_ids = std::move(eos);
  }
  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() { return info_; }  // before an engine is built on it

  std::unique_ptr<KvStorage> make_kv_storage(const KvLayout& layout, int32_t pages) const override {
    return make_host_kv_storage(layout, pages);
  }
  void forward(const model::Batch& batch, const KvStorage& storage, float* logits) override {
    const model::PagedKv& kv = storage.paged_kv();
    ++forwards;
    max_batch_tokens = std::max<int64_t>(max_batch_tokens, batch.num_tokens());
    max_batch_seqs = std::max<int64_t>(max_batch_seqs, static_cast<int64_t>(batch.seqs.size()));
    if (before_forward) before_forward(batch);
    const int32_t ps = kv.page_size;
    ASTRAI_CHECK(kv.dtype == DType::kF32, "fake model: f32 KV cache only");
    std::vector<int32_t> wanted(batch.num_tokens(), -1);
    for (size_t r = 0; r < batch.logit_rows.size(); ++r) wanted[batch.logit_rows[r]] = static_cast<int32_t>(r);
    for (const auto& s : batch.seqs) {
      auto slot = [&](int32_t idx, int32_t layer) {
        ASTRAI_CHECK(idx / ps < static_cast<int32_t>(s.page_table.size()), "fake model: index ", idx,
                     " beyond the page table");
        return static_cast<float*>(kv.k_pages[layer]) + (size_t(s.page_table[idx / ps]) * ps + idx % ps) * 2;
      };
      for (int32_t j = 0; j < s.num_tokens; ++j) {
        const int32_t row = s.token_begin + j;
        const int32_t pos = s.context_len + j;
        ASTRAI_CHECK(batch.positions[row] == pos, "fake model: row ", row, " has position ", batch.positions[row],
                     ", expected ", pos);
        for (int32_t l = 0; l < info_.num_layers; ++l) {
          float* k = slot(pos, l);
          k[0] = static_cast<float>(batch.tokens[row]);
          k[1] = static_cast<float>(pos);
        }
        if (wanted[row] < 0) continue;
        uint64_t h = 0;
        for (int32_t i = 0; i <= pos; ++i) {
          const float* k0 = slot(i, 0);
          const float* k1 = slot(i, info_.num_layers - 1);
          ASTRAI_CHECK(k0[1] == static_cast<float>(i) && k1[1] == k0[1] && k1[0] == k0[0],
                       "fake model: KV slot of index ", i, " holds position ", k0[1], " (stale or foreign page)");
          h = fake_hash_step(h, static_cast<int32_t>(k0[0]));
        }
        float* out = logits + size_t(wanted[row]) * info_.vocab_size;
        fake_logits(h, info_.vocab_size, out);
        // A scripted continuation: the token at position pos + 1 is forced_next[pos + 1].
        if (auto it = forced_next.find(pos + 1); it != forced_next.end()) out[it->second] += 100.0f;
      }
    }
  }

  std::function<void(const model::Batch&)> before_forward;
  std::map<int32_t, int32_t> forced_next;  // position -> token made overwhelmingly likely there
  std::atomic<int64_t> forwards{0};
  std::atomic<int64_t> max_batch_tokens{0};
  std::atomic<int64_t> max_batch_seqs{0};

 private:
  ModelInfo info_;
};

// Byte-level toy tokenizer: ids 0..255 are single bytes, 256.. are the multi-byte pieces below
// (including halves of UTF-8 characters), the rest decode to nothing special ("<id>").
class FakeCodec : public TextCodec {
 public:
  explicit FakeCodec(int32_t vocab = 300, std::vector<int32_t> stops = {}) : vocab_(vocab), stops_(std::move(stops)) {
    pieces_ = {"Hello", " world", "\xE2\x82", "\xAC", "\xF0\x9F", "\x98\x80", "ST", "OP", "</s>", "\xC3\xA9"};
  }
  std::string piece(int32_t id) const {
    if (id < 256) return std::string(1, static_cast<char>(id));
    const size_t k = static_cast<size_t>(id - 256);
    if (k < pieces_.size()) return pieces_[k];
    std::string s = "<";  // (not "<" + ...: GCC 12's -Wrestrict false positive on operator+)
    s += std::to_string(id);
    s += '>';
    return s;
  }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::vector<int32_t> encode_chat(const GenerationRequest& r) const override {
    std::string s;
    for (const auto& m : r.messages) s += m.at("role").get<std::string>() + ": " + m.at("content").get<std::string>() + "\n";
    if (r.add_generation_prompt) s += "assistant: ";
    return encode(s);
  }
  std::vector<int32_t> stop_ids() const override { return stops_; }
  std::unique_ptr<TokenDecoder> decoder() const override {
    struct D : TokenDecoder {
      const FakeCodec* c;
      explicit D(const FakeCodec* codec) : c(codec) {}
      std::string push(int32_t id) override { return c->piece(id); }
    };
    return std::make_unique<D>(this);
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids) s += piece(id);
    return s;
  }

 private:
  int32_t vocab_;
  std::vector<int32_t> stops_;
  std::vector<std::string> pieces_;
};

}  // namespace astrai::infer::testing
