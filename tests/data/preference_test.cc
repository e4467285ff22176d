// PreferenceDataset: pairs read back as written, sides cut to max_tokens, pairs without a
// response token inside the cut left out, and clear errors for the wrong dataset kind.
#include <gtest/gtest.h>

#include <vector>

#include "data/preference.h"
#include "data/shard.h"
#include "test_util.h"

namespace astrai::data {
namespace {

using testing::error_of;
using testing::ScratchDir;

struct Side {
  std::vector<int32_t> ids, mask;
};

void write_pairs(const std::string& dir, const std::vector<std::pair<Side, Side>>& pairs, const char* kind) {
  ShardWriter w(dir);
  w.add_key("chosen", DType::kI32, true);
  w.add_key("chosen_mask", DType::kU8);
  w.add_key("rejected", DType::kI32, true);
  w.add_key("rejected_mask", DType::kU8);
  for (const auto& [c, r] : pairs) {
    w.add_record("chosen", c.ids);
    w.add_record("chosen_mask", c.mask);
    w.add_record("rejected", r.ids);
    w.add_record("rejected_mask", r.mask);
  }
  w.add_group({"chosen", "chosen_mask"});
  w.add_group({"rejected", "rejected_mask"});
  w.finish({{"kind", kind}});
}

TEST(PreferenceDataset, ReadsCutsAndDrops) {
  ScratchDir tmp;
  const std::string dir = tmp.path("pairs");
  write_pairs(dir,
              {{{{1, 2, 3, 4}, {0, 0, 1, 1}}, {{1, 2, 5}, {0, 0, 1}}},             // fits
               {{{1, 2, 3, 4, 5, 6, 7}, {0, 0, 0, 1, 1, 1, 1}}, {{1, 2, 3, 8}, {0, 0, 0, 1}}},  // chosen cut
               {{{1, 2, 3, 4, 5, 6}, {0, 0, 0, 0, 0, 1}}, {{1, 9}, {0, 1}}}},      // no response in 5
              "preference");
  PreferenceDataset d(Shards::open(dir), /*max_tokens=*/5);
  ASSERT_EQ(d.size(), 2);
  EXPECT_EQ(d.dropped(), 1);
  EXPECT_EQ(d.truncated(), 1);
  PreferencePair p;
  d.get(0, &p);
  EXPECT_EQ(p.chosen, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(p.chosen_mask, (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(p.rejected, (std::vector<int32_t>{1, 2, 5}));
  d.get(1, &p);
  EXPECT_EQ(p.chosen, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(p.chosen_mask, (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(p.rejected, (std::vector<int32_t>{1, 2, 3, 8}));
  EXPECT_NE(error_of([&] { d.get(2, &p); }).find("out of range"), std::string::npos);
}

TEST(PreferenceDataset, ClearErrors) {
  ScratchDir tmp;
  write_pairs(tmp.path("lm"), {{{{1, 2}, {0, 1}}, {{1, 3}, {0, 1}}}}, "lm");
  EXPECT_NE(error_of([&] { PreferenceDataset(Shards::open(tmp.path("lm")), 8); }).find("--train-type dpo needs"),
            std::string::npos);
  write_pairs(tmp.path("long"), {{{{1, 2, 3, 4}, {0, 0, 0, 1}}, {{1, 3}, {0, 1}}}}, "preference");
  EXPECT_NE(error_of([&] { PreferenceDataset(Shards::open(tmp.path("long")), 3); }).find("raise --seq-len"),
            std::string::npos);
}

}  // namespace
}  // namespace astrai::data
