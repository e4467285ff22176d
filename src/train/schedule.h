// Learning-rate schedules as pure functions of the update index (0-based: the rate used
// by update s+1), so a resumed run recomputes exactly the rate it would have used.
//   cosine: linear warmup (s+1)/warmup · max, then cosine from max to min over the rest.
//   sgdr:   warmup, then cosine restarts: cycle i lasts cycle_steps · t_mult^i updates.
//   wsd:    warmup, stable at max, then linear decay to min over the last decay_ratio of updates.
// min = max · min_lr_ratio.
#pragma once

#include <cstdint>
#include <string>

namespace astrai::train {

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine | sgdr | wsd
  double max_lr = 3e-4;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  int64_t cycle_steps = 0;   // sgdr: first cycle length (0 = (total - warmup) / 4)
  double t_mult = 2.0;       // sgdr
  double decay_ratio = 0.2;  // wsd
};

// Throws astrai::Error for an unknown kind or inconsistent values.
void validate_schedule(const ScheduleConfig& c);
double learning_rate(const ScheduleConfig& c, int64_t step);

}  // namespace astrai::train
