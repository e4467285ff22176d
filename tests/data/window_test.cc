#include "data/window.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/packing.h"
#include "test_util.h"

namespace astrai::data {
namespace {

using testing::error_of;
using testing::ScratchDir;

// Packs documents into rows of row_len and writes them as a dataset (what preprocess does).
void write_packed(const std::string& dir, const std::vector<std::vector<int32_t>>& docs, int64_t row_len,
                  Packing mode) {
  ShardWriter w(dir);
  w.add_key("sequence", DType::kI32, true);
  w.add_key("loss_mask", DType::kU8);
  w.add_key("position_ids", DType::kI32);
  Packer p(mode, row_len, 0, [&](const PackedRow& r) {
    w.add_record("sequence", r.tokens);
    std::vector<int32_t> m(r.loss_mask.begin(), r.loss_mask.end());
    w.add_record("loss_mask", m);
    w.add_record("position_ids", r.position_ids);
  });
  for (const auto& d : docs) p.add(d);
  p.flush();
  w.add_group({"sequence", "loss_mask", "position_ids"});
  w.finish(Json{{"packing", {{"mode", std::string(packing_name(mode))}, {"row_len", row_len}}}});
}

TEST(Windows, PackedRowsReadOneRowPerSample) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  // Rows of 6 = seq_len 5 + 1: [1 2 3 | 4 5 pad] ... with bfd: docs 3, 2, 4.
  write_packed(dir, {{1, 2, 3}, {11, 12}, {21, 22, 23, 24}}, 6, Packing::kBestFit);
  const Shards s = Shards::open(dir);
  const WindowOptions o = row_windows(s, 5);
  EXPECT_EQ(o.window_size, 5);
  EXPECT_EQ(o.stride, 6);
  WindowDataset ds(s, o);
  ASSERT_EQ(ds.size(), 2);
  Sample x;
  ds.get(0, &x);
  // BFD: the 4-token doc first, then the 2-token doc fits the same row exactly.
  EXPECT_EQ(x.input_ids, (std::vector<int32_t>{21, 22, 23, 24, 11}));
  EXPECT_EQ(x.targets, (std::vector<int32_t>{22, 23, 24, 11, 12}));
  EXPECT_EQ(x.position_ids, (std::vector<int32_t>{0, 1, 2, 3, 0}));
  // Predicting 11 (a new document's first token) from document 21.. never counts.
  EXPECT_EQ(x.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0, 1}));
  EXPECT_EQ(segment_lengths(x.position_ids), (std::vector<int32_t>{4, 1}));
  ds.get(1, &x);
  EXPECT_EQ(x.input_ids, (std::vector<int32_t>{1, 2, 3, 0, 0}));
  EXPECT_EQ(x.targets, (std::vector<int32_t>{2, 3, 0, 0, 0}));
  EXPECT_EQ(x.loss_mask, (std::vector<uint8_t>{1, 1, 0, 0, 0}));  // padding never counts
  EXPECT_EQ(x.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(ds.count_targets(x), 2);
}

TEST(Windows, SlidingWindowsOverTheFlatStreamRebaseTheFirstSegment) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  std::vector<int32_t> doc_a, doc_b;
  for (int i = 0; i < 7; ++i) doc_a.push_back(100 + i);
  for (int i = 0; i < 6; ++i) doc_b.push_back(200 + i);
  write_packed(dir, {doc_a, doc_b}, 4, Packing::kNone);  // unpacked: flat stream of 13 tokens
  WindowOptions o;
  o.window_size = 4;
  o.stride = 3;
  WindowDataset ds(Shards::open(dir), o);
  EXPECT_EQ(ds.size(), (13 - 4 - 1) / 3 + 1);
  Sample x;
  ds.get(1, &x);  // tokens 3..7: a3 a4 a5 a6 | b0
  EXPECT_EQ(x.input_ids, (std::vector<int32_t>{103, 104, 105, 106}));
  EXPECT_EQ(x.targets, (std::vector<int32_t>{104, 105, 106, 200}));
  EXPECT_EQ(x.position_ids, (std::vector<int32_t>{0, 1, 2, 3}));  // stored 3..6, rebased
  EXPECT_EQ(x.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0}));
  ds.get(2, &x);  // tokens 6..10: a6 | b0 b1 b2 b3
  EXPECT_EQ(x.input_ids, (std::vector<int32_t>{106, 200, 201, 202}));
  EXPECT_EQ(x.position_ids, (std::vector<int32_t>{0, 0, 1, 2}));
  EXPECT_EQ(x.loss_mask, (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(segment_lengths(x.position_ids), (std::vector<int32_t>{1, 3}));
  EXPECT_THAT(error_of([&] { ds.get(ds.size(), &x); }), ::testing::HasSubstr("out of range"));
}

TEST(Windows, WithoutMaskOrPositionsEveryTargetCounts) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  {
    ShardWriter w(dir);
    w.add_key("sequence", DType::kU16, true);
    w.add_record("sequence", std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
    w.finish();
  }
  WindowOptions o;
  o.window_size = 3;  // stride defaults to the window size, like the reference
  WindowDataset ds(Shards::open(dir), o);
  EXPECT_EQ(ds.size(), 3);
  Sample x;
  ds.get(2, &x);
  EXPECT_EQ(x.input_ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(x.targets, (std::vector<int32_t>{8, 9, 10}));
  EXPECT_EQ(x.position_ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(x.loss_mask, (std::vector<uint8_t>{1, 1, 1}));
  o.window_size = 10;
  EXPECT_THAT(error_of([&] { WindowDataset(Shards::open(dir), o); }), ::testing::HasSubstr("fewer than one window"));
  o.key = "chosen";
  EXPECT_THAT(error_of([&] { WindowDataset(Shards::open(dir), o); }), ::testing::HasSubstr("no key \"chosen\""));
}

TEST(Windows, EveryTokenIsATargetExactlyOnceWithRowWindows) {
  // With stride = window + 1 over rows of window + 1, the samples partition the stream: each
  // document token except document starts is a counted target exactly once.
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  std::vector<std::vector<int32_t>> docs;
  int32_t next = 1;
  int64_t expected = 0;
  for (int d = 0; d < 30; ++d) {
    std::vector<int32_t> doc;
    for (int k = 0; k < 1 + (d * 7) % 19; ++k) doc.push_back(next++);
    docs.push_back(doc);
  }
  write_packed(dir, docs, 9, Packing::kSimple);
  const Shards s = Shards::open(dir);
  // Each piece's first token is never a target; all other real tokens are.
  const ShardKey& pos = s.key("position_ids");
  const ShardKey& mask = s.key("loss_mask");
  for (int64_t i = 0; i < pos.length; ++i) expected += pos.at_i32(i) != 0 && mask.at_i32(i) != 0;
  WindowDataset ds(s, row_windows(s, 8));
  std::vector<int> seen(static_cast<size_t>(next), 0);
  Sample x;
  int64_t counted = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.get(i, &x);
    for (size_t j = 0; j < x.targets.size(); ++j) {
      if (!x.loss_mask[j]) continue;
      ASSERT_NE(x.targets[j], 0);
      ++seen[static_cast<size_t>(x.targets[j])];
      ++counted;
    }
  }
  EXPECT_EQ(counted, expected);
  for (size_t t = 1; t < seen.size(); ++t) EXPECT_LE(seen[t], 1) << t;
}

}  // namespace
}  // namespace astrai::data
