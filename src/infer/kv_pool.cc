#include "infer/kv_pool.h"

#include <algorithm>

#include "base/error.h"

namespace astrai::infer {

KvPool::KvPool(const KvLayout& layout, int64_t budget_bytes, int32_t min_pages)
    : layout_(layout), index_(layout.page_size) {
  layout.validate();
  const int64_t pages64 = std::max<int64_t>(budget_bytes / layout.page_bytes(), min_pages);
  ASTRAI_CHECK(pages64 >= 1 && pages64 < (int64_t{1} << 30), "KV cache: budget of ", budget_bytes,
               " bytes gives ", pages64, " pages of ", layout.page_bytes(), " bytes");
  const int32_t pages = static_cast<int32_t>(pages64);
  refcount_.assign(pages, 0);
  lru_pos_.resize(pages);
  in_lru_.assign(pages, 0);
  free_.reserve(pages);
  // Stack order: page 0 is handed out first.
  for (int32_t p = pages - 1; p >= 0; --p) free_.push_back(p);
}

bool KvPool::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n <= 0) return true;
  if (n > num_available()) return false;
  for (int32_t i = 0; i < n; ++i) {
    if (free_.empty()) evict_one();
    const int32_t p = free_.back();
    free_.pop_back();
    refcount_[p] = 1;
    out->push_back(p);
  }
  return true;
}

void KvPool::evict_one() {
  const int32_t p = lru_.front();
  lru_.pop_front();
  in_lru_[p] = 0;
  index_.erase_page(p);
  free_.push_back(p);
}

void KvPool::retain(int32_t page) {
  if (refcount_[page]++ == 0 && in_lru_[page]) {
    lru_.erase(lru_pos_[page]);
    in_lru_[page] = 0;
  }
}

void KvPool::to_unreferenced(int32_t page) {
  if (index_.contains_page(page)) {
    lru_.push_back(page);
    lru_pos_[page] = std::prev(lru_.end());
    in_lru_[page] = 1;
  } else {
    free_.push_back(page);
  }
}

void KvPool::release(int32_t page) {
  ASTRAI_CHECK(refcount_[page] > 0, "KV cache: page ", page, " released more often than retained");
  if (--refcount_[page] == 0) to_unreferenced(page);
}

void KvPool::release_all(std::vector<int32_t>* pages) {
  // Release from the end so a sequence's deepest pages reach the LRU first and are evicted
  // before the shared roots of its chain.
  for (auto it = pages->rbegin(); it != pages->rend(); ++it) release(*it);
  pages->clear();
}

int32_t KvPool::match(std::span<const int32_t> tokens, int32_t max_pages, std::vector<int32_t>* pages,
                      ChainLink* link) {
  *link = root();
  if (!prefix_enabled_) return 0;
  const int32_t ps = layout_.page_size;
  int32_t n = 0;
  while (n < max_pages && size_t(n + 1) * ps <= tokens.size()) {
    ChainLink next;
    auto page = index_.find(*link, tokens.subspan(size_t(n) * ps, ps), &next);
    if (!page) break;
    retain(*page);
    pages->push_back(*page);
    *link = next;
    ++n;
  }
  return n;
}

ChainLink KvPool::publish(const ChainLink& parent, std::span<const int32_t> page_tokens, int32_t page) {
  ChainLink link;
  if (!prefix_enabled_) return link;
  int32_t displaced = -1;
  index_.insert(parent, page_tokens, page, &link, &displaced);
  // A displaced page is no longer indexed: if nobody holds it, it goes back to the free list.
  if (displaced >= 0 && in_lru_[displaced]) {
    lru_.erase(lru_pos_[displaced]);
    in_lru_[displaced] = 0;
    free_.push_back(displaced);
  }
  return link;
}

void KvPool::invalidate(uint64_t new_weights_version) {
  index_.clear();
  index_.set_weights_version(new_weights_version);
  for (int32_t p : lru_) {
    in_lru_[p] = 0;
    free_.push_back(p);
  }
  lru_.clear();
}

std::string KvPool::check_invariants() const {
  std::vector<int> state(num_pages(), 0);  // bit 1 free, bit 2 lru, bit 4 referenced
  for (int32_t p : free_) state[p] |= 1;
  for (int32_t p : lru_) state[p] |= 2;
  for (int32_t p = 0; p < num_pages(); ++p) {
    if (refcount_[p] < 0) return str_cat("page ", p, " has refcount ", refcount_[p]);
    if (refcount_[p] > 0) state[p] |= 4;
    if (state[p] != 1 && state[p] != 2 && state[p] != 4)
      return str_cat("page ", p, " is in state mask ", state[p], " (1 free, 2 cached, 4 referenced)");
    if ((state[p] == 2) != (in_lru_[p] != 0)) return str_cat("page ", p, " LRU flag out of sync");
    if (state[p] == 2 && !index_.contains_page(p)) return str_cat("cached page ", p, " is not indexed");
    if (state[p] == 1 && index_.contains_page(p)) return str_cat("free page ", p, " is still indexed");
  }
  return "";
}

}  // namespace astrai::infer
