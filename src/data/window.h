// Sliding-window samples over a token stream (the `sequence` key of a dataset, read as one
// flat array across its records, like the reference's windowed datasets).
//
// Sample i covers tokens [b, b + window_size + 1) with b = i * stride:
//   input_ids[j]    = seq[b + j]                      j in [0, window_size)
//   targets[j]      = seq[b + j + 1]
//   loss_mask[j]    = 1 iff target j counts: loss_mask[b + j + 1] != 0 (all 1 without a
//                     loss_mask key) and target j does not start a new document
//                     (position_ids[b + j + 1] != 0): packed documents never predict each other
//   position_ids[j] = position_ids[b + j], except that the window's first segment is rebased
//                     to start at 0 (the window has no context before it). Without a
//                     position_ids key: 0, 1, ..., window_size - 1 (one segment).
// So in every sample each document segment begins exactly where position_ids == 0, and
// segment_lengths() recovers the per-document spans the trainer's attention must respect.
//
// Packed datasets written with rows of seq_len + 1 tokens (meta "row_len") are read one row
// per sample with window_size = seq_len and stride = row_len (see row_windows()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/shard.h"

namespace astrai::data {

struct Sample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> targets;
  std::vector<uint8_t> loss_mask;
  std::vector<int32_t> position_ids;
};

struct WindowOptions {
  int64_t window_size = 0;
  int64_t stride = 0;  // 0 means window_size
  std::string key = "sequence";
};

// Window options that read a packed dataset row by row when its rows hold seq_len + 1 tokens,
// and otherwise slide windows of seq_len with stride seq_len.
WindowOptions row_windows(const Shards& shards, int64_t seq_len);

class WindowDataset {
 public:
  // Throws astrai::Error if the key is missing, not integer, or holds fewer than
  // window_size + 1 tokens, or if loss_mask/position_ids exist but are not aligned with it.
  WindowDataset(Shards shards, const WindowOptions& options);

  int64_t size() const { return size_; }
  int64_t window_size() const { return window_; }
  int64_t stride() const { return stride_; }
  const Shards& shards() const { return shards_; }

  // Fills `out` with sample i (vectors are resized; reuse one Sample to avoid allocations).
  void get(int64_t i, Sample* out) const;
  // Number of targets that count in sample i (cheap way to weight losses across samples).
  int64_t count_targets(const Sample& s) const;

 private:
  Shards shards_;
  // Copies of the keys (they share the mappings), so a copied dataset stays valid.
  ShardKey seq_;
  std::optional<ShardKey> mask_;
  std::optional<ShardKey> pos_;
  int64_t window_ = 0;
  int64_t stride_ = 0;
  int64_t size_ = 0;
};

// Lengths of the document segments of a sample: a new segment starts at j = 0 and at every
// j > 0 with position_ids[j] == 0. Sums to position_ids.size().
std::vector<int32_t> segment_lengths(const std::vector<int32_t>& position_ids);

}  // namespace astrai::data
