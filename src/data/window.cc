#include "data/window.h"

#include <algorithm>

#include "base/error.h"

namespace astrai::data {

WindowOptions row_windows(const Shards& shards, int64_t seq_len) {
  WindowOptions o;
  o.window_size = seq_len;
  o.stride = seq_len;
  const Json& meta = shards.meta();
  if (auto p = meta.find("packing"); p != meta.end() && p->is_object()) {
    const int64_t row_len = p->value("row_len", int64_t{0});
    if (row_len == seq_len + 1) o.stride = row_len;
  }
  return o;
}

WindowDataset::WindowDataset(Shards shards, const WindowOptions& options)
    : shards_(std::move(shards)), window_(options.window_size), stride_(options.stride ? options.stride : options.window_size) {
  ASTRAI_CHECK(window_ >= 1, "window dataset: window_size must be at least 1, got ", window_);
  ASTRAI_CHECK(stride_ >= 1, "window dataset: stride must be at least 1, got ", stride_);
  seq_ = shards_.key(options.key);
  ASTRAI_CHECK(seq_.dtype != DType::kF32, "dataset ", shards_.dir(), ": key \"", options.key,
               "\" is not integer token ids");
  auto aligned = [&](const char* name) -> std::optional<ShardKey> {
    if (!shards_.has(name)) return std::nullopt;
    const ShardKey& k = shards_.key(name);
    ASTRAI_CHECK(k.length == seq_.length, "dataset ", shards_.dir(), ": \"", name, "\" has ", k.length,
                 " elements but \"", options.key, "\" has ", seq_.length);
    ASTRAI_CHECK(k.dtype != DType::kF32, "dataset ", shards_.dir(), ": \"", name, "\" must be an integer key");
    return k;
  };
  mask_ = aligned("loss_mask");
  pos_ = aligned("position_ids");
  const int64_t n = seq_.length;
  ASTRAI_CHECK(n >= window_ + 1, "dataset ", shards_.dir(), ": \"", options.key, "\" has ", n,
               " tokens, fewer than one window of ", window_, " + 1 (lower --seq-len or add data)");
  size_ = (n - window_ - 1) / stride_ + 1;
}

void WindowDataset::get(int64_t i, Sample* out) const {
  ASTRAI_CHECK(i >= 0 && i < size_, "window dataset: sample ", i, " out of range [0, ", size_, ")");
  const int64_t b = i * stride_;
  const auto w = static_cast<size_t>(window_);
  out->input_ids.resize(w + 1);
  seq_.read_i32(b, b + window_ + 1, out->input_ids.data());
  out->targets.assign(out->input_ids.begin() + 1, out->input_ids.end());
  out->input_ids.resize(w);

  out->position_ids.resize(w + 1);
  if (pos_) {
    pos_->read_i32(b, b + window_ + 1, out->position_ids.data());
  } else {
    for (size_t j = 0; j <= w; ++j) out->position_ids[j] = static_cast<int32_t>(j);
  }
  out->loss_mask.resize(w);
  if (mask_) {
    // Reuse targets' neighbour buffer: read mask values for target positions b+1 .. b+w.
    std::vector<int32_t> m(w);
    mask_->read_i32(b + 1, b + window_ + 1, m.data());
    for (size_t j = 0; j < w; ++j) out->loss_mask[j] = m[j] != 0;
  } else {
    std::fill(out->loss_mask.begin(), out->loss_mask.end(), 1);
  }
  if (pos_) {
    for (size_t j = 0; j < w; ++j) {
      if (out->position_ids[j + 1] == 0) out->loss_mask[j] = 0;
    }
  }
  out->position_ids.resize(w);
  // Rebase the first segment: the window starts mid-document when its first position is not 0.
  const int32_t base = out->position_ids[0];
  if (base != 0) {
    for (size_t j = 0; j < w && (j == 0 || out->position_ids[j] != 0); ++j) out->position_ids[j] -= base;
  }
}

int64_t WindowDataset::count_targets(const Sample& s) const {
  int64_t n = 0;
  for (uint8_t m : s.loss_mask) n += m;
  return n;
}

std::vector<int32_t> segment_lengths(const std::vector<int32_t>& position_ids) {
  std::vector<int32_t> out;
  for (size_t j = 0; j < position_ids.size(); ++j) {
    if (j == 0 || position_ids[j] == 0) out.push_back(0);
    ++out.back();
  }
  return out;
}

}  // namespace astrai::data
