#include "train/batch_source.h"

#include "base/error.h"
#include "base/log.h"
#include "data/preference.h"
#include "data/shard.h"
#include "data/window.h"
#include "train/dpo.h"

namespace astrai::train {

namespace {

class WindowSource final : public BatchSource {
 public:
  WindowSource(data::Shards shards, int64_t seq_len) : data_(open(std::move(shards), seq_len)) {}
  int64_t size() const override { return data_.size(); }
  std::string sample_noun() const override { return str_cat("sequences of ", data_.window_size(), " tokens"); }

  void fill(const std::vector<int64_t>& samples, TrainBatch* b) override {
    *b = TrainBatch{};
    for (int64_t idx : samples) {
      data_.get(idx, &sample_);
      const auto& s = sample_;
      targets_.resize(s.targets.size());
      for (size_t j = 0; j < s.targets.size(); ++j) targets_[j] = s.loss_mask[j] ? s.targets[j] : kIgnore;
      int32_t off = 0;
      for (int32_t len : data::segment_lengths(s.position_ids)) {
        b->add_rows(s.input_ids.data() + off, targets_.data() + off, s.position_ids.data() + off, len);
        off += len;
      }
    }
  }

 private:
  static data::WindowDataset open(data::Shards shards, int64_t seq_len) {
    const data::WindowOptions windows = data::row_windows(shards, seq_len);
    const std::string dir = shards.dir();
    data::WindowDataset d(std::move(shards), windows);
    ASTRAI_CHECK(d.window_size() == seq_len, dir, ": windows of ", d.window_size(), " tokens, expected --seq-len ",
                 seq_len);
    return d;
  }

  data::WindowDataset data_;
  data::Sample sample_;
  std::vector<int32_t> targets_;
};

class PairSource final : public BatchSource {
 public:
  PairSource(data::Shards shards, int64_t seq_len) : data_(std::move(shards), seq_len + 1), seq_len_(seq_len) {
    if (data_.dropped() > 0)
      log_warn(data_.shards().dir(), ": ", data_.dropped(), " preference pairs left out: a side has no response token ",
               "within --seq-len ", seq_len, " tokens");
    if (data_.truncated() > 0)
      log_info(data_.shards().dir(), ": ", data_.truncated(), " of ", data_.size(),
               " preference pairs cut to --seq-len ", seq_len, " (the ends of their responses are not trained)");
  }
  int64_t size() const override { return data_.size(); }
  std::string sample_noun() const override {
    return str_cat("preference pairs (up to ", seq_len_ + 1, " tokens a side)");
  }

  void fill(const std::vector<int64_t>& samples, TrainBatch* b) override {
    *b = TrainBatch{};
    for (int64_t idx : samples) {
      data_.get(idx, &pair_);
      add_preference_pair(b, pair_.chosen, pair_.chosen_mask, pair_.rejected, pair_.rejected_mask);
    }
  }

 private:
  data::PreferenceDataset data_;
  int64_t seq_len_;
  data::PreferencePair pair_;
};

}  // namespace

std::unique_ptr<BatchSource> open_batch_source(const std::string& train_type, const std::string& data_dir,
                                               int64_t seq_len, int64_t vocab_size) {
  auto shards = data::Shards::open(data_dir);
  shards.check_vocab(vocab_size);
  const std::string kind = shards.kind();
  if (train_type == "dpo") return std::make_unique<PairSource>(std::move(shards), seq_len);
  // "lm" (preprocess) and "imported" (HDF5; its keys are checked by the window reader).
  ASTRAI_CHECK(kind != "preference" && kind != "prompt", data_dir, " holds \"", kind, "\" records, which --train-type ",
               train_type, " cannot read",
               kind == "preference" ? " (preference pairs train with --train-type dpo)" : " (prompts: --train-type grpo)",
               "; seq and sft read text, chat and instruction records (an \"lm\" dataset)");
  return std::make_unique<WindowSource>(std::move(shards), seq_len);
}

}  // namespace astrai::train
