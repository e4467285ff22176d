// Seeded, resumable, rank-sharded random sampler, and a fixed-seed train/validation split.
//
// Epoch e's order is a permutation of the sample pool drawn from (seed, e) alone, identical on
// every rank. Rank r of world_size takes positions r, r + world_size, r + 2 * world_size, ...
// of that order, so ranks are disjoint within an epoch. Without drop_last the order is
// extended by wrapping around its start until it divides evenly (every sample is seen, a few
// twice); with drop_last the tail is dropped.
//
// The whole state is (epoch, consumed): `consumed` samples of this rank's share of the current
// epoch have been handed out. Restoring it continues the exact same sequence, so a resumed run
// sees the same samples as an uninterrupted one.
#pragma once

#include <cstdint>
#include <vector>

#include "base/json.h"
#include "base/rng.h"

namespace astrai::data {

struct SamplerState {
  int64_t epoch = 0;
  int64_t consumed = 0;
};

struct SamplerOptions {
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
  bool drop_last = false;
};

class Sampler {
 public:
  // Samples are 0 .. num_samples - 1.
  Sampler(int64_t num_samples, const SamplerOptions& options);
  // Samples are the given pool (e.g. the training half of a split), in pool order when not
  // shuffling.
  Sampler(std::vector<int64_t> pool, const SamplerOptions& options);

  int64_t pool_size() const { return static_cast<int64_t>(pool_.size()); }
  // Samples this rank gets per epoch.
  int64_t per_rank() const { return per_rank_; }

  // The next sample index for this rank; rolls over into the next epoch when this one is done.
  int64_t next();
  std::vector<int64_t> next_batch(int64_t n);
  // This rank's ordered share of epoch e (does not change the state).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  const SamplerState& state() const { return state_; }
  void set_state(const SamplerState& s);
  // {"epoch", "consumed", "seed", "rank", "world_size", "pool_size", "shuffle", "drop_last"}.
  Json to_json() const;
  // Restores from to_json() of any rank; the configuration fields must match this sampler's
  // (a resume with another seed or dataset is an error, not a silent reshuffle). Another world
  // size continues at the same global position (consumed × world size), which must divide
  // by the new world size.
  void load_json(const Json& j);

 private:
  void build_epoch();

  std::vector<int64_t> pool_;
  SamplerOptions options_;
  int64_t per_rank_ = 0;
  SamplerState state_;
  int64_t built_epoch_ = -1;
  std::vector<int64_t> order_;  // this rank's share of built_epoch_
};

struct Split {
  std::vector<int64_t> train;
  std::vector<int64_t> val;
};

// Splits 0 .. n - 1 into train and validation sets: round(n * val_fraction) indices (at
// least 1 when val_fraction > 0) chosen by a seeded shuffle; both lists sorted. The training
// set must stay non-empty. Note that overlapping windows (stride < window_size + 1) share
// tokens across the split.
Split split_train_val(int64_t n, double val_fraction, uint64_t seed);

}  // namespace astrai::data
