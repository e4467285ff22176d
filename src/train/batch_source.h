// Where the trainer's micro-batches come from: a dataset directory read as the train type
// needs it, turning sample indices (from data::Sampler) into a TrainBatch.
//   seq, sft: an "lm" dataset read in windows of --seq-len tokens (data/window.h); a sample
//             is a window, split into its packed documents.
//   dpo:      a "preference" dataset (data/preference.h); a sample is a pair, two documents
//             of at most --seq-len + 1 tokens each (dpo.h's pair layout).
//   grpo:     a "prompt" dataset (data/prompts.h); a sample is a prompt, turned into
//             --group-size completions by the inference engine (rollout.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/json.h"
#include "train/train_batch.h"

namespace astrai::train {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t size() const = 0;  // samples
  // Replaces *batch with the given samples.
  virtual void fill(const std::vector<int64_t>& samples, TrainBatch* batch) = 0;
  // "sequences of 256 tokens", "preference pairs of up to 257 tokens a side" (log lines).
  virtual std::string sample_noun() const = 0;
  // Adds what the fill()s since the last call measured to an update's metrics record.
  virtual void add_metrics(Json* /*rec*/) {}
  // The trainer applied optimizer update `version` (1-based) to the weights.
  virtual void after_update(int64_t /*version*/) {}
  // Sources that measure held-out samples themselves (GRPO: rewards of generated text)
  // instead of the strategy's loss: validate() returns the val_* fields of the record.
  virtual bool validates_itself() const { return false; }
  virtual Json validate(const std::vector<int64_t>& /*samples*/) { return Json::object(); }
};

// Opens data_dir for train_type; a dataset of the wrong kind is an error that names the kind
// and the --train-type that reads it. Token ids are checked against vocab_size.
std::unique_ptr<BatchSource> open_batch_source(const std::string& train_type, const std::string& data_dir,
                                               int64_t seq_len, int64_t vocab_size);

}  // namespace astrai::train
