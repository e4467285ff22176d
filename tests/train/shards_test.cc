// ZeRO-1 partitioning (train/shards.h): blocks, which rank owns which slice, and that the
// sharded pieces — block norms, clipping, AdamW over slices — give the unsharded bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "train/optimizer.h"
#include "train/shards.h"

namespace astrai::train {
namespace {

// Tensors of the given sizes laid out as params.h does (16-float aligned offsets); returns the
// buffer's size in `total`.
std::vector<ParamSpec> layout_of(const std::vector<size_t>& sizes, size_t* total) {
  std::vector<ParamSpec> specs;
  size_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ParamSpec s;
    s.name = "p";
    s.name += std::to_string(i);
    s.shape = {static_cast<int64_t>(sizes[i])};
    s.kind = i % 3 == 0 ? model::ParamKind::kNorm : model::ParamKind::kMatrix;
    s.offset = off;
    s.numel = sizes[i];
    off += (sizes[i] + 15) / 16 * 16;
    specs.push_back(s);
  }
  *total = off;
  return specs;
}

TEST(TrainShards, BlocksCutTensorsAtTheirBoundaries) {
  size_t total = 0;
  const auto specs = layout_of({5, 100, 33, 64}, &total);
  const auto blocks = param_blocks(specs, 32);
  // 5 -> 1 block; 100 -> 32+32+32+4; 33 -> 32+1; 64 -> 32+32.
  ASSERT_EQ(blocks.size(), 1u + 4u + 2u + 2u);
  size_t covered = 0;
  for (const Block& b : blocks) {
    EXPECT_LE(b.end - b.begin, 32u);
    EXPECT_GT(b.end, b.begin);
    covered += b.end - b.begin;
  }
  EXPECT_EQ(covered, 5u + 100u + 33u + 64u);
  EXPECT_EQ(blocks[1].begin, specs[1].offset);  // a tensor starts a block
  EXPECT_EQ(blocks[4].end, specs[1].offset + 100);
  EXPECT_EQ(blocks[5].begin, specs[2].offset);
}

TEST(TrainShards, PlanTilesTheBufferInBalancedWholeBlocks) {
  size_t total = 0;
  const auto specs = layout_of({1000, 3000, 17, 4096, 250, 2500, 64, 999}, &total);
  for (int ranks : {1, 2, 3, 4, 7}) {
    const ShardPlan plan(specs, total, ranks, 128);
    const auto& blocks = plan.blocks();
    ASSERT_EQ(plan.bounds().size(), static_cast<size_t>(ranks) + 1);
    EXPECT_EQ(plan.begin(0), 0u);
    EXPECT_EQ(plan.end(ranks - 1), total);
    size_t params = 0;
    for (const Block& b : blocks) params += b.end - b.begin;
    size_t owned = 0;
    for (int r = 0; r < ranks; ++r) {
      EXPECT_LE(plan.begin(r), plan.end(r));
      if (r > 0) {
        EXPECT_EQ(plan.begin(r), plan.end(r - 1));
      }
      EXPECT_LE(plan.first_block(r), plan.first_block(r + 1));
      // Every owned block lies inside the rank's slice, so no block straddles two ranks.
      for (size_t b = plan.first_block(r); b < plan.first_block(r + 1); ++b) {
        EXPECT_GE(blocks[b].begin, plan.begin(r));
        EXPECT_LE(blocks[b].end, plan.end(r));
      }
      // Balanced to within one block of the ideal share.
      const double ideal = static_cast<double>(params) / ranks;
      EXPECT_LE(std::abs(static_cast<double>(plan.owned_params(r)) - ideal), 2 * 128.0) << ranks << " ranks, rank " << r;
      owned += plan.owned_params(r);
    }
    EXPECT_EQ(owned, params);
    EXPECT_EQ(plan.first_block(ranks), blocks.size());
  }
}

TEST(TrainShards, OneRankOwnsAllAndMoreRanksThanBlocksLeaveSomeEmpty) {
  size_t total = 0;
  const auto specs = layout_of({10, 20}, &total);
  const ShardPlan one(specs, total, 1);
  EXPECT_EQ(one.begin(0), 0u);
  EXPECT_EQ(one.end(0), total);
  EXPECT_EQ(one.owned_params(0), 30u);
  const ShardPlan many(specs, total, 5);  // 2 blocks, 5 ranks
  size_t owned = 0, empty = 0;
  for (int r = 0; r < 5; ++r) {
    owned += many.owned_params(r);
    empty += many.size(r) == 0 ? 1 : 0;
    if (r > 0) {
      EXPECT_EQ(many.begin(r), many.end(r - 1));
    }
  }
  EXPECT_EQ(owned, 30u);
  EXPECT_EQ(empty, 3u);
  EXPECT_EQ(many.end(4), total);
  EXPECT_THROW(ShardPlan(specs, total, 0), std::exception);
}

// ZeRO-1's update on N simulated ranks — each rank's block norms gathered by a sum with zeros,
// the clip and AdamW on its slice only, the slices then copied together — equals the update
// of one AdamW over the whole buffer, bit for bit, over several steps.
TEST(TrainShards, ShardedNormClipAndAdamWEqualUnshardedBits) {
  size_t total = 0;
  const auto specs = layout_of({300, 1000, 7, 2049, 512, 64, 1500}, &total);
  AdamWConfig c;
  c.weight_decay = 0.1f;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> init(total, 0.0f);
  for (const auto& s : specs)
    for (size_t i = 0; i < s.numel; ++i) init[s.offset + i] = nd(rng);
  for (int ranks : {2, 3, 4}) {
    const ShardPlan full_plan(specs, total, 1, 256), plan(specs, total, ranks, 256);
    AdamW full(specs, total, c);
    std::vector<AdamW> parts;
    for (int r = 0; r < ranks; ++r) parts.emplace_back(specs, total, plan.begin(r), plan.end(r), c);
    std::vector<float> p_full = init, p_shard = init;
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g(total, 0.0f);
      for (const auto& s : specs)
        for (size_t i = 0; i < s.numel; ++i) g[s.offset + i] = 3.0f * nd(rng);
      std::vector<float> g_full = g, g_shard = g;
      // Unsharded: every block, summed in order.
      std::vector<double> pf(full_plan.blocks().size(), 0.0);
      block_sq_norms(g_full.data(), full_plan.blocks(), 0, pf.size(), pf.data());
      const double norm_full = grad_norm_from_blocks(pf);
      scale_grads(g_full.data(), 0, total, clip_coefficient(norm_full, 1.0));
      full.step(p_full.data(), g_full.data(), 1e-2f);
      // Sharded: each rank's partials (zeros elsewhere), summed across ranks like an all-reduce.
      std::vector<double> ps(plan.blocks().size(), 0.0);
      for (int r = 0; r < ranks; ++r) {
        std::vector<double> mine(plan.blocks().size(), 0.0);
        block_sq_norms(g_shard.data(), plan.blocks(), plan.first_block(r), plan.first_block(r + 1), mine.data());
        for (size_t b = 0; b < ps.size(); ++b) ps[b] += mine[b];
      }
      const double norm_shard = grad_norm_from_blocks(ps);
      ASSERT_EQ(norm_shard, norm_full);
      ASSERT_LT(clip_coefficient(norm_shard, 1.0), 1.0f);  // the clip acts
      std::vector<float> gathered = p_shard;
      for (int r = 0; r < ranks; ++r) {
        std::vector<float> local = p_shard;  // each rank holds the whole weights
        scale_grads(g_shard.data(), plan.begin(r), plan.end(r), clip_coefficient(norm_shard, 1.0));
        parts[static_cast<size_t>(r)].step(local.data(), g_shard.data(), 1e-2f);
        std::memcpy(gathered.data() + plan.begin(r), local.data() + plan.begin(r), plan.size(r) * sizeof(float));
      }
      p_shard = gathered;
      ASSERT_EQ(std::memcmp(p_full.data(), p_shard.data(), total * sizeof(float)), 0) << ranks << " ranks, step " << step;
    }
    // The moments: each rank's are the slice of the whole ones; the state shrinks by ~ranks.
    int64_t bytes = 0;
    for (int r = 0; r < ranks; ++r) {
      const AdamW& a = parts[static_cast<size_t>(r)];
      ASSERT_EQ(const_cast<AdamW&>(a).m().size(), plan.size(r));
      EXPECT_EQ(std::memcmp(const_cast<AdamW&>(a).m().data(), full.m().data() + plan.begin(r), plan.size(r) * 4), 0);
      EXPECT_EQ(std::memcmp(const_cast<AdamW&>(a).v().data(), full.v().data() + plan.begin(r), plan.size(r) * 4), 0);
      bytes += a.state_bytes();
    }
    EXPECT_EQ(bytes, full.state_bytes());
  }
}

TEST(TrainShards, BlockNormMatchesTheNaiveNorm) {
  size_t total = 0;
  const auto specs = layout_of({70000, 5, 140000}, &total);
  std::vector<float> g(total, 0.0f);
  double naive = 0.0;
  for (const auto& s : specs)
    for (size_t i = 0; i < s.numel; ++i) {
      g[s.offset + i] = static_cast<float>((i % 13) - 6) * 0.01f;
      naive += static_cast<double>(g[s.offset + i]) * g[s.offset + i];
    }
  const ShardPlan plan(specs, total, 1);
  EXPECT_EQ(plan.blocks().size(), 2u + 1u + 3u);  // 65536-float blocks
  std::vector<double> p(plan.blocks().size());
  block_sq_norms(g.data(), plan.blocks(), 0, p.size(), p.data());
  EXPECT_NEAR(grad_norm_from_blocks(p), std::sqrt(naive), 1e-9 * std::sqrt(naive));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(NAN, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(5.0, 0.0), 1.0f);
  EXPECT_FLOAT_EQ(clip_coefficient(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
}

}  // namespace
}  // namespace astrai::train
