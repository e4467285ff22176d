// The bookkeeping of the paged KV cache's pages, sized from a byte budget (the page memory is
// the backend's KvStorage, kv_storage.h; the pool only hands out page ids). A page is in exactly one state:
//   free        on the free list, refcount 0, not indexed;
//   referenced  refcount >= 1 (owned by one or more sequences' page tables), maybe indexed;
//   cached      refcount 0 and indexed by the prefix cache, on the LRU list (evictable).
// So free + cached == total whenever no sequence holds pages. Allocation takes free pages
// first, then evicts the least recently released cached page. Only full pages whose every slot
// was written by a completed forward are published to the prefix cache.
//
// Not thread-safe: owned and used by the engine thread only.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <vector>

#include "infer/kv_storage.h"
#include "infer/prefix_cache.h"

namespace astrai::infer {

class KvPool {
 public:
  // Pages = budget / page_bytes (at least min_pages). Throws astrai::Error for a bad layout.
  KvPool(const KvLayout& layout, int64_t budget_bytes, int32_t min_pages = 1);

  const KvLayout& layout() const { return layout_; }
  int32_t page_size() const { return layout_.page_size; }
  int32_t num_pages() const { return static_cast<int32_t>(refcount_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_cached() const { return static_cast<int32_t>(lru_.size()); }
  int32_t num_referenced() const { return num_pages() - num_free() - num_cached(); }
  // Pages an allocation could get right now (free + evictable).
  int32_t num_available() const { return num_free() + num_cached(); }
  int32_t refcount(int32_t page) const { return refcount_[page]; }

  // Appends n new pages (refcount 1) to `out`; false (and nothing taken) if fewer are available.
  bool allocate(int32_t n, std::vector<int32_t>* out);
  void retain(int32_t page);
  // Drops one reference; at zero the page becomes cached (if indexed) or free.
  void release(int32_t page);
  void release_all(std::vector<int32_t>* pages);  // and clears the vector

  // Prefix cache. `enabled` false turns lookups and publishing off.
  void set_prefix_cache(bool enabled) { prefix_enabled_ = enabled; }
  bool prefix_cache_enabled() const { return prefix_enabled_; }
  ChainLink root() const { return index_.root(index_.weights_version()); }
  // Longest run of full cached pages matching `tokens` from the start, at most max_pages;
  // each matched page is retained and appended to `pages`. `link` ends at the last match.
  int32_t match(std::span<const int32_t> tokens, int32_t max_pages, std::vector<int32_t>* pages, ChainLink* link);
  // Publishes a page the caller holds whose every slot is written with `page_tokens`;
  // returns the link for the next page of the same chain.
  ChainLink publish(const ChainLink& parent, std::span<const int32_t> page_tokens, int32_t page);
  // Weights changed: nothing cached so far may be matched again.
  void invalidate(uint64_t new_weights_version);
  uint64_t weights_version() const { return index_.weights_version(); }

  // Checks the state invariant over all pages; returns "" or a description of the violation.
  std::string check_invariants() const;

 private:
  void to_unreferenced(int32_t page);
  void evict_one();

  KvLayout layout_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;
  std::list<int32_t> lru_;  // cached pages, least recently released first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<uint8_t> in_lru_;
  PrefixIndex index_;
  bool prefix_enabled_ = true;
};

}  // namespace astrai::infer
