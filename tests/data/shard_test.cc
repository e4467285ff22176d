#include "data/shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/files.h"
#include "test_util.h"

namespace astrai::data {
namespace {

using ::testing::HasSubstr;
using testing::error_of;
using testing::ScratchDir;

// Writes a small dataset: two records per key, a grouped pair and a float key.
void write_small(const std::string& dir, bool overwrite = false) {
  ShardWriter w(dir, overwrite);
  w.add_key("sequence", DType::kI32, /*token_ids=*/true);
  w.add_key("loss_mask", DType::kU8);
  w.add_key("reward", DType::kF32);
  w.add_key("small", DType::kU16, /*token_ids=*/true);
  const std::vector<int32_t> a{5, 6, 7}, b{8, 9};
  w.add_record("sequence", a);
  w.add_record("sequence", b);
  w.add_record("loss_mask", std::vector<int32_t>{0, 1, 1});
  w.add_record("loss_mask", std::vector<int32_t>{1, 0});
  w.add_record("reward", std::vector<float>{0.5f});
  w.add_record("reward", std::vector<float>{-2.25f});
  w.add_record("small", std::vector<int32_t>{65535, 0, 1});
  w.add_group({"sequence", "loss_mask"});
  w.finish(Json{{"tokenizer", {{"vocab_size", 100}}}});
}

TEST(Shards, RoundTripKeepsValuesDtypesAndRecords) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  write_small(dir);
  const Shards s = Shards::open(dir);
  EXPECT_EQ(s.key_names(), (std::vector<std::string>{"loss_mask", "reward", "sequence", "small"}));
  const ShardKey& seq = s.key("sequence");
  EXPECT_EQ(seq.dtype, DType::kI32);
  EXPECT_EQ(seq.length, 5);
  ASSERT_EQ(seq.records(), 2);
  EXPECT_EQ(seq.record_begin(1), 3);
  EXPECT_EQ(seq.record_end(1), 5);
  std::vector<int32_t> got(5);
  seq.read_i32(0, 5, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(s.key("loss_mask").dtype, DType::kU8);
  EXPECT_EQ(s.key("loss_mask").at_i32(1), 1);
  EXPECT_EQ(s.key("loss_mask").at_i32(4), 0);
  float r[2];
  s.key("reward").read_f32(0, 2, r);
  EXPECT_EQ(r[0], 0.5f);
  EXPECT_EQ(r[1], -2.25f);
  EXPECT_EQ(s.key("small").at_i32(0), 65535);
  EXPECT_TRUE(s.key("small").token_ids);
  EXPECT_EQ(s.max_token_id(), 65535);
  ASSERT_EQ(s.groups().size(), 1u);
  EXPECT_EQ(s.meta()["tokenizer"]["vocab_size"], 100);
  // Raw little-endian layout on disk, as documented.
  EXPECT_EQ(read_file(dir + "/sequence.bin").size(), 20u);
  EXPECT_EQ(read_file(dir + "/sequence.idx").size(), 24u);
  // No temporary directory left behind.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.root())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(Shards, UnfinishedWriterLeavesNothing) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  {
    ShardWriter w(dir);
    w.add_key("sequence", DType::kI32, true);
    w.add_record("sequence", std::vector<int32_t>{1, 2, 3});
  }
  EXPECT_FALSE(file_exists(dir));
  EXPECT_TRUE(std::filesystem::is_empty(tmp.root()));
}

TEST(Shards, RefusesToClobberUnlessOverwriteAndOnlyDatasets) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  write_small(dir);
  EXPECT_THAT(error_of([&] { ShardWriter w(dir); }), HasSubstr("already exists"));
  write_small(dir, /*overwrite=*/true);  // replacing a dataset is fine
  EXPECT_EQ(Shards::open(dir).key("sequence").length, 5);
  std::filesystem::create_directory(tmp.path("notes"));
  write_file_atomic(tmp.path("notes/todo.txt"), "keep me");
  EXPECT_THAT(error_of([&] { ShardWriter w(tmp.path("notes"), true); }), HasSubstr("not a dataset directory"));
  EXPECT_TRUE(file_exists(tmp.path("notes/todo.txt")));
}

TEST(Shards, WriterRejectsValuesOutsideTheDtype) {
  ScratchDir tmp;
  ShardWriter w(tmp.path("ds"));
  w.add_key("small", DType::kU16, true);
  EXPECT_THAT(error_of([&] { w.append("small", std::vector<int32_t>{70000}); }), HasSubstr("does not fit"));
  w.add_key("mask", DType::kU8);
  EXPECT_THAT(error_of([&] { w.append("mask", std::vector<float>{0.5f}); }), HasSubstr("non-integer"));
  EXPECT_THAT(error_of([&] { w.append("nope", std::vector<int32_t>{1}); }), HasSubstr("undeclared key"));
}

TEST(Shards, GroupedKeysMustAgree) {
  ScratchDir tmp;
  ShardWriter w(tmp.path("ds"));
  w.add_key("sequence", DType::kI32, true);
  w.add_key("loss_mask", DType::kU8);
  w.add_record("sequence", std::vector<int32_t>{1, 2, 3});
  w.add_record("loss_mask", std::vector<int32_t>{1, 1});
  w.add_group({"sequence", "loss_mask"});
  EXPECT_THAT(error_of([&] { w.finish(); }), HasSubstr("different record boundaries"));
  EXPECT_FALSE(file_exists(tmp.path("ds")));
}

TEST(Shards, TruncatedShardIsAClearError) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  write_small(dir);
  std::filesystem::resize_file(dir + "/sequence.bin", 18);
  EXPECT_THAT(error_of([&] { Shards::open(dir); }), HasSubstr("truncated or corrupt shard"));
}

TEST(Shards, FlippedByteFailsTheChecksum) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  write_small(dir);
  std::string bytes = read_file(dir + "/sequence.bin");
  bytes[6] ^= 0x10;
  write_file_atomic(dir + "/sequence.bin", bytes);
  EXPECT_THAT(error_of([&] { Shards::open(dir); }), HasSubstr("fails its checksum"));
  // Skipping the checksum still opens (sizes are right).
  ShardOpenOptions o;
  o.verify_checksums = false;
  EXPECT_NO_THROW(Shards::open(dir, o));
}

TEST(Shards, CorruptIndexAndMetaAreClearErrors) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  write_small(dir);
  // Offsets that go backwards.
  std::string idx = read_file(dir + "/sequence.idx");
  const int64_t bad = 9;
  std::memcpy(idx.data() + 8, &bad, 8);
  write_file_atomic(dir + "/sequence.idx", idx);
  EXPECT_THAT(error_of([&] { Shards::open(dir); }), HasSubstr("ends before it begins"));

  write_small(dir, true);
  Json meta = read_json_file(dir + "/meta.json");
  meta["keys"]["loss_mask"]["length"] = 4;
  write_file_atomic(dir + "/meta.json", meta.dump());
  EXPECT_THAT(error_of([&] { Shards::open(dir); }), HasSubstr("loss_mask.bin"));

  write_small(dir, true);
  meta = read_json_file(dir + "/meta.json");
  meta["version"] = 99;
  write_file_atomic(dir + "/meta.json", meta.dump());
  EXPECT_THAT(error_of([&] { Shards::open(dir); }), HasSubstr("version 99 is not supported"));

  write_small(dir, true);
  std::filesystem::remove(dir + "/reward.bin");
  EXPECT_THAT(error_of([&] { Shards::open(dir); }), HasSubstr("missing data file"));

  write_small(dir, true);
  write_file_atomic(dir + "/meta.json", "{\"format\": ");
  EXPECT_THAT(error_of([&] { Shards::open(dir); }), HasSubstr("invalid JSON"));

  EXPECT_THAT(error_of([&] { Shards::open(tmp.path("nothing")); }), HasSubstr("no such directory"));
}

TEST(Shards, MismatchedGroupLengthsOnDiskAreDetected) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  {
    // Write two ungrouped keys of different lengths, then declare them a group by hand (as a
    // hand-edited or foreign meta.json would).
    ShardWriter w(dir);
    w.add_key("sequence", DType::kI32, true);
    w.add_key("loss_mask", DType::kU8);
    w.add_record("sequence", std::vector<int32_t>{1, 2, 3});
    w.add_record("loss_mask", std::vector<int32_t>{1, 1});
    w.finish();
  }
  Json meta = read_json_file(dir + "/meta.json");
  meta["groups"] = Json::array({Json::array({"sequence", "loss_mask"})});
  write_file_atomic(dir + "/meta.json", meta.dump());
  EXPECT_THAT(error_of([&] { Shards::open(dir); }), HasSubstr("mismatched lengths"));
}

TEST(Shards, VocabCheckNamesTheOffendingToken) {
  ScratchDir tmp;
  const std::string dir = tmp.path("ds");
  {
    ShardWriter w(dir);
    w.add_key("sequence", DType::kI32, true);
    w.add_key("loss_mask", DType::kU8);  // not token ids: never checked against the vocab
    w.add_record("sequence", std::vector<int32_t>{1, 2, 3});
    w.add_record("sequence", std::vector<int32_t>{4, 50, 6});
    w.add_record("loss_mask", std::vector<int32_t>{200, 1, 1, 1, 1, 1});
    w.finish();
  }
  const Shards s = Shards::open(dir);
  EXPECT_NO_THROW(s.check_vocab(64));
  EXPECT_NO_THROW(s.check_vocab(51));
  const std::string msg = error_of([&] { s.check_vocab(50); });
  EXPECT_THAT(msg, HasSubstr("element 4 (record 1) is token id 50"));
  // A model smaller than the tokenizer that wrote the data is rejected even when the ids fit.
  {
    ShardWriter w(dir, true);
    w.add_key("sequence", DType::kI32, true);
    w.add_record("sequence", std::vector<int32_t>{1, 2, 3});
    w.finish(Json{{"tokenizer", {{"vocab_size", 64}}}});
  }
  EXPECT_THAT(error_of([&] { Shards::open(dir).check_vocab(32); }), HasSubstr("mismatched tokenizer and model"));
  {
    ShardWriter w(dir, true);
    w.add_key("sequence", DType::kI32, true);
    w.add_record("sequence", std::vector<int32_t>{1, -3});
    w.finish();
  }
  EXPECT_THAT(error_of([&] { Shards::open(dir).check_vocab(32); }), HasSubstr("token id -3"));
}

TEST(Shards, ChecksumDependsOnEveryByteAndTheLength) {
  std::vector<uint8_t> a(37, 0);
  const uint64_t h0 = shard_checksum(a.data(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 1;
    EXPECT_NE(shard_checksum(a.data(), a.size()), h0) << i;
    a[i] = 0;
  }
  EXPECT_NE(shard_checksum(a.data(), 36), h0);
}

}  // namespace
}  // namespace astrai::data
