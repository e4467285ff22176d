// KvPool + PrefixIndex + Scheduler bookkeeping: page states, prefix matching and
// verification, LRU eviction, invalidation, and a randomized drive of the scheduler.
#include <gtest/gtest.h>

#include <random>

#include "infer/kv_pool.h"
#include "infer/scheduler.h"

using namespace astrai::infer;

namespace {
KvLayout layout(int32_t page_size = 4) {
  KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 1;
  l.k_head_dim = 2;
  l.v_head_dim = 2;
  l.page_size = page_size;
  return l;
}
KvPool make_pool(int32_t pages, int32_t page_size = 4) {
  return KvPool(layout(page_size), layout(page_size).page_bytes() * pages);
}
std::vector<int32_t> iota_tokens(int32_t n, int32_t start = 0) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = start + i;
  return t;
}
}  // namespace

TEST(KvPool, SizedFromBudgetAndRejectsBadLayouts) {
  EXPECT_EQ(make_pool(10).num_pages(), 10);
  EXPECT_EQ(layout().page_bytes(), 4 * 2 * 4 * (2 + 2));
  KvLayout bad = layout();
  bad.num_kv_heads = 0;
  EXPECT_THROW(KvPool(bad, 1 << 20), astrai::Error);
  bad = layout(0);
  EXPECT_THROW(KvPool(bad, 1 << 20), astrai::Error);
  bad = layout();
  bad.dtype = astrai::DType::kF16;
  EXPECT_THROW(KvPool(bad, 1 << 20), astrai::Error);
}

TEST(KvStorage, Bf16PagesTakeHalfTheBytesAndCopyWhole) {
  KvLayout l = layout();
  l.dtype = astrai::DType::kBF16;
  EXPECT_EQ(l.page_bytes() * 2, layout().page_bytes());
  KvPool pool(l, l.page_bytes() * 3);
  EXPECT_EQ(pool.num_pages(), 3);
  const auto storage = make_host_kv_storage(l, pool.num_pages());
  const astrai::model::PagedKv& kv = storage->paged_kv();
  EXPECT_EQ(kv.dtype, astrai::DType::kBF16);
  // Page = 4 slots x 2 dims = 8 bf16 per layer for K (and V): fill page 1, copy it to page 2.
  for (int32_t layer = 0; layer < 2; ++layer) {
    auto* k = static_cast<uint16_t*>(kv.k_pages[layer]);
    auto* v = static_cast<uint16_t*>(kv.v_pages[layer]);
    for (int i = 0; i < 8; ++i) k[8 + i] = static_cast<uint16_t>(100 * layer + i), v[8 + i] = static_cast<uint16_t>(7 + i);
  }
  storage->copy_page(1, 2);
  for (int32_t layer = 0; layer < 2; ++layer) {
    const auto* k = static_cast<const uint16_t*>(kv.k_pages[layer]);
    const auto* v = static_cast<const uint16_t*>(kv.v_pages[layer]);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(k[16 + i], 100 * layer + i);
      EXPECT_EQ(v[16 + i], 7 + i);
      EXPECT_EQ(k[i], 0);  // page 0 untouched
    }
  }
  EXPECT_THROW(make_host_kv_storage(l, 0), astrai::Error);
}

TEST(KvPool, AllocateReleaseAndStates) {
  auto pool = make_pool(4);
  std::vector<int32_t> pages;
  EXPECT_TRUE(pool.allocate(3, &pages));
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_FALSE(pool.allocate(2, &pages));  // all or nothing
  EXPECT_EQ(pages.size(), 3u);
  pool.retain(pages[0]);
  EXPECT_EQ(pool.refcount(pages[0]), 2);
  pool.release(pages[0]);
  EXPECT_EQ(pool.check_invariants(), "");
  pool.release_all(&pages);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_THROW(pool.release(0), astrai::Error);
}

TEST(KvPool, PrefixMatchVerifiesTokensAndChains) {
  auto pool = make_pool(8);
  auto tokens = iota_tokens(10);  // 2 full pages + 2 tokens
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.allocate(3, &pages));
  ChainLink link = pool.root();
  link = pool.publish(link, std::span<const int32_t>(tokens).subspan(0, 4), pages[0]);
  link = pool.publish(link, std::span<const int32_t>(tokens).subspan(4, 4), pages[1]);
  // Matching while the owner still holds the pages shares them.
  std::vector<int32_t> got;
  ChainLink end;
  EXPECT_EQ(pool.match(tokens, 10, &got, &end), 2);
  EXPECT_EQ(got, (std::vector<int32_t>{pages[0], pages[1]}));
  EXPECT_EQ(pool.refcount(pages[0]), 2);
  pool.release_all(&got);
  // A different first page breaks the chain even if the second page's tokens agree.
  auto other = tokens;
  other[0] = 99;
  EXPECT_EQ(pool.match(other, 10, &got, &end), 0);
  // max_pages bounds the match.
  EXPECT_EQ(pool.match(tokens, 1, &got, &end), 1);
  pool.release_all(&got);
  pool.release_all(&pages);
  EXPECT_EQ(pool.num_cached(), 2);
  EXPECT_EQ(pool.num_free(), 6);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(KvPool, LruEvictsOnlyUnreferencedPagesOldestFirst) {
  auto pool = make_pool(3);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.allocate(1, &a));
  ASSERT_TRUE(pool.allocate(1, &b));
  auto ta = iota_tokens(4, 0), tb = iota_tokens(4, 100);
  pool.publish(pool.root(), ta, a[0]);
  pool.publish(pool.root(), tb, b[0]);
  pool.release_all(&a);  // a released first: evicted first
  pool.release_all(&b);
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.allocate(2, &c));  // 1 free + evicts a
  std::vector<int32_t> got;
  ChainLink end;
  EXPECT_EQ(pool.match(ta, 1, &got, &end), 0);
  EXPECT_EQ(pool.match(tb, 1, &got, &end), 1);  // b survives, now referenced
  EXPECT_FALSE(pool.allocate(1, &c));            // referenced pages are never evicted
  pool.release_all(&got);
  pool.release_all(&c);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_EQ(pool.num_available(), 3);
}

TEST(KvPool, InvalidationDropsEveryEntry) {
  auto pool = make_pool(4);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(2, &a));
  auto t = iota_tokens(4);
  pool.publish(pool.root(), t, a[0]);
  pool.release(a[0]);
  pool.publish(pool.root(), iota_tokens(4, 50), a[1]);  // still referenced when invalidated
  pool.invalidate(7);
  EXPECT_EQ(pool.weights_version(), 7u);
  std::vector<int32_t> got;
  ChainLink end;
  EXPECT_EQ(pool.match(t, 1, &got, &end), 0);
  pool.release(a[1]);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(KvPool, DuplicatePublishKeepsOneEntry) {
  auto pool = make_pool(4);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.allocate(1, &a));
  ASSERT_TRUE(pool.allocate(1, &b));
  auto t = iota_tokens(4);
  ChainLink la = pool.publish(pool.root(), t, a[0]);
  ChainLink lb = pool.publish(pool.root(), t, b[0]);  // computed concurrently: same content
  EXPECT_EQ(la.stamp, lb.stamp);
  pool.release_all(&a);
  pool.release_all(&b);
  EXPECT_EQ(pool.num_cached(), 1);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PrefixIndex, HashDependsOnParentAndTokens) {
  auto t = iota_tokens(4);
  EXPECT_NE(PrefixIndex::chain_hash(1, t), PrefixIndex::chain_hash(2, t));
  auto u = t;
  u[3] = 9;
  EXPECT_NE(PrefixIndex::chain_hash(1, t), PrefixIndex::chain_hash(1, u));
}

// Drives the scheduler with random arrivals, finishes, cancellations and preemptions (a
// small pool), simulating the forward by advancing num_computed, and checks the page-state
// invariant after every step and that every page returns at the end.
TEST(Scheduler, RandomizedDriveKeepsPageInvariant) {
  std::mt19937 rng(77);
  auto pool = make_pool(48, 4);
  SchedulerOptions so;
  so.max_running = 8;
  so.max_step_tokens = 32;
  Scheduler sched(pool, so);
  std::vector<std::unique_ptr<RequestState>> reqs;
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<int32_t> common = iota_tokens(30, 1000);
  uint64_t order = 1;
  int finished = 0, cancelled = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    if (rng() % 3 == 0) {
      auto req = std::make_unique<RequestState>();
      auto seq = std::make_unique<Sequence>();
      seq->req = req.get();
      seq->order = order++;
      const int32_t len = 1 + rng() % 40;
      seq->tokens = rng() % 2 ? std::vector<int32_t>(common.begin(), common.begin() + std::min(len, 30))
                              : std::vector<int32_t>();
      while (static_cast<int32_t>(seq->tokens.size()) < len) seq->tokens.push_back(rng() % 50);
      seq->prompt_len = len;
      req->max_len = len + 1 + rng() % 30;
      sched.add_waiting(seq.get());
      reqs.push_back(std::move(req));
      seqs.push_back(std::move(seq));
    }
    auto step = sched.schedule();
    for (const auto& item : step) {
      ASSERT_LE(item.seq->num_computed + item.num_tokens,
                static_cast<int32_t>(item.seq->pages.size()) * pool.page_size());
      ASSERT_GT(item.num_tokens, 0);
    }
    sched.commit_step();
    for (const auto& item : step) {
      Sequence* s = item.seq;
      if (!item.sample) continue;
      s->tokens.push_back(rng() % 50);
      if (static_cast<int32_t>(s->tokens.size()) >= s->req->max_len || rng() % 40 == 0) {
        sched.remove(s);
        s->finished = true;
        ++finished;
      }
    }
    // Random cancellation of anything not finished.
    if (rng() % 7 == 0 && !seqs.empty()) {
      Sequence* s = seqs[rng() % seqs.size()].get();
      if (!s->finished) {
        sched.remove(s);
        s->finished = true;
        ++cancelled;
      }
    }
    ASSERT_EQ(pool.check_invariants(), "") << "iteration " << iter;
    int32_t held = 0;
    for (const auto& s : seqs) held += static_cast<int32_t>(s->pages.size());
    ASSERT_GE(held, pool.num_referenced());
  }
  for (auto& s : seqs)
    if (!s->finished) sched.remove(s.get());
  EXPECT_TRUE(sched.idle());
  EXPECT_EQ(pool.num_referenced(), 0);
  EXPECT_EQ(pool.num_free() + pool.num_cached(), pool.num_pages());
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_GT(sched.preemptions(), 0u);
  EXPECT_GT(sched.cache_hit_tokens(), 0u);
  EXPECT_GT(finished, 100);
  EXPECT_GT(cancelled, 5);
}
