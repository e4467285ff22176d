#include "data/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"

namespace astrai::data {

namespace {

// Fisher-Yates with a generator seeded from (seed, stream): deterministic everywhere.
void shuffle(std::vector<int64_t>& v, uint64_t seed, uint64_t stream) {
  SplitMix64 rng(seed ^ (stream * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.below(i));
    std::swap(v[i - 1], v[j]);
  }
}

std::vector<int64_t> iota_pool(int64_t n) {
  ASTRAI_CHECK(n >= 0, "sampler: negative sample count ", n);
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

Sampler::Sampler(int64_t num_samples, const SamplerOptions& options) : Sampler(iota_pool(num_samples), options) {}

Sampler::Sampler(std::vector<int64_t> pool, const SamplerOptions& options)
    : pool_(std::move(pool)), options_(options) {
  ASTRAI_CHECK(options_.world_size >= 1, "sampler: world_size must be at least 1, got ", options_.world_size);
  ASTRAI_CHECK(options_.rank >= 0 && options_.rank < options_.world_size, "sampler: rank ", options_.rank,
               " outside [0, ", options_.world_size, ")");
  ASTRAI_CHECK(!pool_.empty(), "sampler: no samples");
  const auto n = static_cast<int64_t>(pool_.size());
  const int64_t w = options_.world_size;
  per_rank_ = options_.drop_last ? n / w : (n + w - 1) / w;
  ASTRAI_CHECK(per_rank_ > 0, "sampler: ", n, " samples cannot be shared by ", w, " ranks with drop_last");
}

std::vector<int64_t> Sampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> perm = pool_;
  if (options_.shuffle) shuffle(perm, options_.seed, static_cast<uint64_t>(epoch));
  const int64_t w = options_.world_size;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  const auto n = static_cast<int64_t>(perm.size());
  for (int64_t k = 0; k < per_rank_; ++k) {
    const int64_t pos = options_.rank + k * w;  // position in the (wrapped) global order
    mine.push_back(perm[static_cast<size_t>(pos % n)]);
  }
  return mine;
}

void Sampler::build_epoch() {
  if (built_epoch_ == state_.epoch) return;
  order_ = epoch_order(state_.epoch);
  built_epoch_ = state_.epoch;
}

int64_t Sampler::next() {
  if (state_.consumed >= per_rank_) {
    ++state_.epoch;
    state_.consumed = 0;
  }
  build_epoch();
  return order_[static_cast<size_t>(state_.consumed++)];
}

std::vector<int64_t> Sampler::next_batch(int64_t n) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) out.push_back(next());
  return out;
}

void Sampler::set_state(const SamplerState& s) {
  ASTRAI_CHECK(s.epoch >= 0 && s.consumed >= 0 && s.consumed <= per_rank_, "sampler: invalid state (epoch ", s.epoch,
               ", consumed ", s.consumed, " of ", per_rank_, ")");
  state_ = s;
}

Json Sampler::to_json() const {
  return Json{{"epoch", state_.epoch},
              {"consumed", state_.consumed},
              {"seed", options_.seed},
              {"rank", options_.rank},
              {"world_size", options_.world_size},
              {"pool_size", pool_size()},
              {"shuffle", options_.shuffle},
              {"drop_last", options_.drop_last}};
}

void Sampler::load_json(const Json& j) {
  const std::string where = "sampler state";
  ASTRAI_CHECK(j.is_object(), where, ": not a JSON object");
  const auto seed = json_required<uint64_t>(j, "seed", where);
  const auto world = json_required<int>(j, "world_size", where);
  const auto pool = json_required<int64_t>(j, "pool_size", where);
  ASTRAI_CHECK(seed == options_.seed, where, ": saved with seed ", seed, ", resuming with seed ", options_.seed);
  ASTRAI_CHECK(world >= 1, where, ": world size ", world);
  ASTRAI_CHECK(pool == pool_size(), where, ": saved over ", pool, " samples, the dataset now has ", pool_size(),
               " (different data or window settings)");
  ASTRAI_CHECK(json_optional<bool>(j, "shuffle", options_.shuffle, where) == options_.shuffle &&
                   json_optional<bool>(j, "drop_last", options_.drop_last, where) == options_.drop_last,
               where, ": saved with different shuffle/drop_last settings");
  SamplerState s;
  s.epoch = json_required<int64_t>(j, "epoch", where);
  s.consumed = json_required<int64_t>(j, "consumed", where);
  if (world != options_.world_size) {
    // All ranks consumed the same count, so the epoch's first consumed × world positions are
    // taken; another world size continues from the same position of the same order.
    const int64_t saved_per_rank = options_.drop_last ? pool / world : (pool + world - 1) / world;
    if (s.consumed >= saved_per_rank) s = SamplerState{s.epoch + 1, 0};  // that epoch was done
    const int64_t position = s.consumed * world;
    ASTRAI_CHECK(position % options_.world_size == 0 && position / options_.world_size <= per_rank_, where,
                 ": saved by ", world, " ranks at position ", position, " of epoch ", s.epoch,
                 ", which ", options_.world_size, " ranks cannot continue from (not a multiple of ",
                 options_.world_size, " within the epoch)");
    s.consumed = position / options_.world_size;
  }
  set_state(s);
}

Split split_train_val(int64_t n, double val_fraction, uint64_t seed) {
  ASTRAI_CHECK(n >= 0, "split: negative sample count");
  ASTRAI_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "split: validation fraction must be in [0, 1), got ",
               val_fraction);
  Split s;
  if (n == 0) return s;
  int64_t nval = static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
  if (val_fraction > 0.0 && nval == 0) nval = 1;
  ASTRAI_CHECK(nval < n, "split: ", n, " samples leave nothing to train on with validation fraction ",
               val_fraction);
  std::vector<int64_t> perm = iota_pool(n);
  shuffle(perm, seed, 0x5EED5B1170ull);
  s.val.assign(perm.begin(), perm.begin() + nval);
  s.train.assign(perm.begin() + nval, perm.end());
  std::sort(s.val.begin(), s.val.end());
  std::sort(s.train.begin(), s.train.end());
  return s;
}

}  // namespace astrai::data
