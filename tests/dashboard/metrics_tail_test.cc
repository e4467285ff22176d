// MetricsTail: incremental reads by offset, a partly written last line, the trainer's file
// replacement (new generation), truncation, non-JSON lines, several record kinds.
#include <gtest/gtest.h>

#include <cstdio>

#include "base/files.h"
#include "dashboard/metrics_tail.h"
#include "test_util.h"

namespace astrai::dashboard {
namespace {

using testing::append;
using testing::error_of;
using testing::ScratchDir;

TEST(MetricsTail, MissingFileWaits) {
  ScratchDir dir;
  MetricsTail tail(dir.path("metrics.jsonl"));
  EXPECT_FALSE(tail.poll());
  EXPECT_FALSE(tail.exists());
  EXPECT_EQ(tail.generation(), 0u);
  append(dir.path("metrics.jsonl"), "{\"step\":1,\"loss\":2.5}\n");
  EXPECT_TRUE(tail.poll());
  EXPECT_TRUE(tail.exists());
  EXPECT_EQ(tail.generation(), 1u);
  ASSERT_EQ(tail.lines().size(), 1u);
}

TEST(MetricsTail, PartialLastLineWaitsForItsNewline) {
  ScratchDir dir;
  const std::string f = dir.path("metrics.jsonl");
  append(f, "{\"step\":1,\"loss\":2.5,\"lr\":0.001}\n{\"step\":2,\"lo");
  MetricsTail tail(f);
  tail.poll();
  ASSERT_EQ(tail.lines().size(), 1u);
  EXPECT_EQ(tail.lines()[0], "{\"step\":1,\"loss\":2.5,\"lr\":0.001}");
  EXPECT_EQ(tail.pending(), "{\"step\":2,\"lo");
  EXPECT_FALSE(tail.poll());  // nothing new
  append(f, "ss\":2.25}\n");
  EXPECT_TRUE(tail.poll());
  ASSERT_EQ(tail.lines().size(), 2u);
  EXPECT_EQ(tail.lines()[1], "{\"step\":2,\"loss\":2.25}");
  EXPECT_EQ(tail.pending(), "");
  EXPECT_EQ(tail.generation(), 1u);
}

TEST(MetricsTail, IncrementalReadsKeepEveryRecordOnce) {
  ScratchDir dir;
  const std::string f = dir.path("metrics.jsonl");
  MetricsTail tail(f);
  for (int step = 1; step <= 50; ++step) {
    // Each record arrives in two writes, split at a different byte, sometimes polled between.
    const std::string line = "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(3.0 / step) + "}\n";
    const size_t cut = static_cast<size_t>(step) % line.size();
    append(f, line.substr(0, cut));
    if (step % 3 == 0) tail.poll();
    append(f, line.substr(cut));
    if (step % 2 == 0) tail.poll();
  }
  tail.poll();
  ASSERT_EQ(tail.lines().size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Json::parse(tail.lines()[i])["step"], i + 1);
}

TEST(MetricsTail, SeveralRecordKindsAndBadLines) {
  ScratchDir dir;
  const std::string f = dir.path("metrics.jsonl");
  append(f,
         "{\"step\":0,\"val_loss\":3.1}\n"                                            // --val-at-start
         "{\"step\":1,\"loss\":3.0,\"lr\":1e-4,\"grad_norm\":1.2,\"tokens_per_s\":900}\r\n"  // CRLF tolerated
         "\n"
         "not json\n"
         "[1,2]\n"
         "{\"step\":2,\"loss\":0.6,\"rewards_margin\":0.1,\"rewards_accuracy\":0.5}\n"  // dpo
         "{\"step\":3,\"loss\":0.1,\"reward_mean\":0.25,\"kl\":0.01,\"staleness\":0}\n");  // grpo
  MetricsTail tail(f);
  tail.poll();
  ASSERT_EQ(tail.lines().size(), 4u);
  EXPECT_EQ(tail.skipped_lines(), 2);
  EXPECT_EQ(Json::parse(tail.lines()[1])["grad_norm"], 1.2);
  EXPECT_EQ(Json::parse(tail.lines()[3])["kl"], 0.01);
}

TEST(MetricsTail, ReplacedFileStartsANewGeneration) {
  ScratchDir dir;
  const std::string f = dir.path("metrics.jsonl");
  append(f, "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.9}\n{\"step\":3,\"loss\":1.8}\n");
  MetricsTail tail(f);
  tail.poll();
  ASSERT_EQ(tail.lines().size(), 3u);
  // What the trainer does on a new run (or --resume): a new file renamed over the old one,
  // here longer than what was read, so only the inode tells.
  write_file_atomic(f, "{\"step\":1,\"loss\":7}\n{\"step\":2,\"loss\":6}\n{\"step\":3,\"loss\":5}\n{\"step\":4,\"loss\":4}\n");
  EXPECT_TRUE(tail.poll());
  EXPECT_EQ(tail.generation(), 2u);
  ASSERT_EQ(tail.lines().size(), 4u);
  EXPECT_EQ(Json::parse(tail.lines()[0])["loss"], 7);
}

TEST(MetricsTail, TruncatedInPlaceStartsOver) {
  ScratchDir dir;
  const std::string f = dir.path("metrics.jsonl");
  append(f, "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.9}\n");
  MetricsTail tail(f);
  tail.poll();
  { std::FILE* t = std::fopen(f.c_str(), "w"); std::fclose(t); }  // same inode, size 0
  append(f, "{\"step\":1,\"loss\":9}\n");
  EXPECT_TRUE(tail.poll());
  EXPECT_EQ(tail.generation(), 2u);
  ASSERT_EQ(tail.lines().size(), 1u);
  EXPECT_EQ(Json::parse(tail.lines()[0])["loss"], 9);
}

TEST(ReadMetricsFile, ParsesAllAndAFinalLineWithoutNewline) {
  ScratchDir dir;
  const std::string f = dir.path("metrics.jsonl");
  append(f, "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.5}");
  const auto records = read_metrics_file(f);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1]["loss"], 1.5);
}

TEST(ReadMetricsFile, ClearErrors) {
  ScratchDir dir;
  EXPECT_NE(error_of([&] { read_metrics_file(dir.path("metrics.jsonl")); }).find("No such file"), std::string::npos);
  append(dir.path("metrics.jsonl"), "");
  EXPECT_NE(error_of([&] { read_metrics_file(dir.path("metrics.jsonl")); }).find("empty file"), std::string::npos);
  append(dir.path("metrics.jsonl"), "garbage\n");
  EXPECT_NE(error_of([&] { read_metrics_file(dir.path("metrics.jsonl")); }).find("1 unreadable lines"), std::string::npos);
}

}  // namespace
}  // namespace astrai::dashboard
