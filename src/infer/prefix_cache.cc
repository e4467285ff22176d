#include "infer/prefix_cache.h"

#include <algorithm>

#include "base/rng.h"

namespace astrai::infer {
namespace {
// A 64-bit mixing hash: the first output of the generator seeded with x.
uint64_t mix(uint64_t x) { return SplitMix64(x).next(); }
}  // namespace

ChainLink PrefixIndex::root(uint64_t weights_version) const {
  return ChainLink{mix(weights_version ^ 0x5eedc0ffee123457ull), 0};
}

uint64_t PrefixIndex::chain_hash(uint64_t parent_hash, std::span<const int32_t> page_tokens) {
  uint64_t h = mix(parent_hash);
  for (int32_t t : page_tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

std::optional<int32_t> PrefixIndex::find(const ChainLink& parent, std::span<const int32_t> page_tokens,
                                         ChainLink* link) const {
  if (static_cast<int32_t>(page_tokens.size()) != page_size_) return std::nullopt;
  const uint64_t h = chain_hash(parent.hash, page_tokens);
  auto it = by_hash_.find(h);
  if (it == by_hash_.end()) return std::nullopt;
  const Entry& e = by_page_.at(it->second);
  if (e.parent_stamp != parent.stamp || e.version != version_ ||
      !std::equal(e.tokens.begin(), e.tokens.end(), page_tokens.begin(), page_tokens.end()))
    return std::nullopt;
  if (link) *link = ChainLink{e.hash, e.stamp};
  return e.page;
}

bool PrefixIndex::insert(const ChainLink& parent, std::span<const int32_t> page_tokens, int32_t page,
                         ChainLink* link, int32_t* displaced) {
  *displaced = -1;
  const uint64_t h = chain_hash(parent.hash, page_tokens);
  if (auto it = by_hash_.find(h); it != by_hash_.end()) {
    const Entry& e = by_page_.at(it->second);
    const bool same = e.parent_stamp == parent.stamp && e.version == version_ &&
                      std::equal(e.tokens.begin(), e.tokens.end(), page_tokens.begin(), page_tokens.end());
    if (same) {
      *link = ChainLink{e.hash, e.stamp};
      return false;
    }
    *displaced = e.page;
    erase_page(e.page);
  }
  Entry e;
  e.hash = h;
  e.stamp = next_stamp_++;
  e.parent_stamp = parent.stamp;
  e.version = version_;
  e.page = page;
  e.tokens.assign(page_tokens.begin(), page_tokens.end());
  *link = ChainLink{e.hash, e.stamp};
  by_hash_[h] = page;
  by_page_[page] = std::move(e);
  return true;
}

void PrefixIndex::erase_page(int32_t page) {
  auto it = by_page_.find(page);
  if (it == by_page_.end()) return;
  by_hash_.erase(it->second.hash);
  by_page_.erase(it);
}

std::vector<int32_t> PrefixIndex::clear() {
  std::vector<int32_t> pages;
  pages.reserve(by_page_.size());
  for (const auto& [page, e] : by_page_) pages.push_back(page);
  by_page_.clear();
  by_hash_.clear();
  return pages;
}

}  // namespace astrai::infer
