#include "infer/kv_pool.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace astrai::infer {

KvPool::KvPool(const KvLayout& layout, int64_t budget_bytes, int32_t min_pages)
    : layout_(layout), index_(layout.page_size) {
  ASTRAI_CHECK(layout.num_layers > 0 && layout.num_kv_heads > 0 && layout.k_head_dim > 0 && layout.v_head_dim > 0,
               "KV cache: bad model layout (", layout.num_layers, " layers, ", layout.num_kv_heads, " kv heads)");
  ASTRAI_CHECK(layout.page_size >= 1 && layout.page_size <= 4096, "KV cache: page size must be in [1, 4096], got ",
               layout.page_size);
  ASTRAI_CHECK(layout.dtype == DType::kF32 || layout.dtype == DType::kBF16, "KV cache: elements must be F32 or BF16, not ",
               dtype_name(layout.dtype));
  const int64_t pages64 = std::max<int64_t>(budget_bytes / layout.page_bytes(), min_pages);
  ASTRAI_CHECK(pages64 >= 1 && pages64 < (int64_t{1} << 30), "KV cache: budget of ", budget_bytes,
               " bytes gives ", pages64, " pages of ", layout.page_bytes(), " bytes");
  const int32_t pages = static_cast<int32_t>(pages64);
  // HugeBuffer counts floats: the byte size of each layer's K (V) array, rounded up to floats.
  const size_t esz = dtype_size(layout.dtype);
  const size_t k_floats = (size_t(pages) * layout.page_size * layout.num_kv_heads * layout.k_head_dim * esz + 3) / 4;
  const size_t v_floats = (size_t(pages) * layout.page_size * layout.num_kv_heads * layout.v_head_dim * esz + 3) / 4;
  kv_.page_size = layout.page_size;
  kv_.dtype = layout.dtype;
  kv_.num_kv_heads = layout.num_kv_heads;
  kv_.k_head_dim = layout.k_head_dim;
  kv_.v_head_dim = layout.v_head_dim;
  k_storage_.resize(layout.num_layers);
  v_storage_.resize(layout.num_layers);
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    k_storage_[l] = HugeBuffer(k_floats);  // zero-filled
    v_storage_[l] = HugeBuffer(v_floats);
    kv_.k_pages.push_back(k_storage_[l].data());
    kv_.v_pages.push_back(v_storage_[l].data());
  }
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

void KvPool::copy_page(int32_t src, int32_t dst) {
  const size_t esz = dtype_size(layout_.dtype);
  const size_t kn = size_t(layout_.page_size) * layout_.num_kv_heads * layout_.k_head_dim * esz;  // bytes
  const size_t vn = size_t(layout_.page_size) * layout_.num_kv_heads * layout_.v_head_dim * esz;
  for (int32_t l = 0; l < layout_.num_layers; ++l) {
    char* k = static_cast<char*>(kv_.k_pages[l]);
    char* v = static_cast<char*>(kv_.v_pages[l]);
    std::memcpy(k + dst * kn, k + src * kn, kn);
    std::memcpy(v + dst * vn, v + src * vn, vn);
  }
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
