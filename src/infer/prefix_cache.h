// Prefix cache index: full KV pages keyed by a chained hash of (parent hash, page tokens).
// A lookup walks a prompt page by page from the root and stops at the first miss. Every hit is
// verified against the stored tokens and against the exact parent entry (each published entry
// has a unique stamp, and a child records its parent's stamp), so a 64-bit hash collision can
// never hand out K/V computed for different tokens. Entries carry the weights version their
// K/V came from; the root hash includes it, and invalidation drops everything older.
//
// This class only indexes pages; which pages are free / referenced / cached is KvPool's job.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace astrai::infer {

// Position in a hash chain: what a page's successor needs to be looked up or published.
struct ChainLink {
  uint64_t hash = 0;   // chained hash up to and including this page
  uint64_t stamp = 0;  // unique id of the entry that holds this page (0 = root)
};

class PrefixIndex {
 public:
  explicit PrefixIndex(int32_t page_size) : page_size_(page_size) {}

  // The link every chain starts from, for the given weights version.
  ChainLink root(uint64_t weights_version) const;
  static uint64_t chain_hash(uint64_t parent_hash, std::span<const int32_t> page_tokens);

  // The page holding `page_tokens` right after `parent`, if cached and verified.
  std::optional<int32_t> find(const ChainLink& parent, std::span<const int32_t> page_tokens,
                              ChainLink* link) const;

  // Registers a fully written page. If identical content is already indexed (another request
  // computed it at the same time), nothing changes and false is returned; `link` is then the
  // existing entry's link so the caller's chain continues through it. An entry under the same
  // hash that fails verification (an orphan whose parent was evicted, or a collision) is
  // replaced; its page is reported in *displaced (else -1) and is no longer indexed.
  bool insert(const ChainLink& parent, std::span<const int32_t> page_tokens, int32_t page, ChainLink* link,
              int32_t* displaced);

  bool contains_page(int32_t page) const { return by_page_.count(page) != 0; }
  void erase_page(int32_t page);
  // Drops every entry; returns the pages that were indexed.
  std::vector<int32_t> clear();
  size_t size() const { return by_page_.size(); }
  uint64_t weights_version() const { return version_; }
  void set_weights_version(uint64_t v) { version_ = v; }

 private:
  struct Entry {
    uint64_t hash = 0;
    uint64_t stamp = 0;
    uint64_t parent_stamp = 0;
    uint64_t version = 0;
    int32_t page = -1;
    std::vector<int32_t> tokens;
  };
  int32_t page_size_;
  uint64_t version_ = 0;
  uint64_t next_stamp_ = 1;
  std::unordered_map<uint64_t, int32_t> by_hash_;  // hash -> page
  std::unordered_map<int32_t, Entry> by_page_;
};

}  // namespace astrai::infer
