#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace astrai::train {

void validate_schedule(const ScheduleConfig& c) {
  ASTRAI_CHECK(c.kind == "cosine" || c.kind == "sgdr" || c.kind == "wsd", "unknown schedule \"", c.kind,
               "\" (cosine, sgdr, wsd)");
  ASTRAI_CHECK(c.max_lr > 0, "max learning rate must be positive");
  ASTRAI_CHECK(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1, "min-lr-ratio must be in [0, 1]");
  ASTRAI_CHECK(c.warmup_steps >= 0 && c.total_steps > 0, "warmup and total steps must be non-negative");
  ASTRAI_CHECK(c.t_mult >= 1.0, "sgdr t_mult must be >= 1");
  ASTRAI_CHECK(c.decay_ratio >= 0 && c.decay_ratio <= 1, "wsd decay ratio must be in [0, 1]");
}

double learning_rate(const ScheduleConfig& c, int64_t s) {
  const double max = c.max_lr, min = c.max_lr * c.min_lr_ratio;
  if (s < c.warmup_steps) return max * static_cast<double>(s + 1) / static_cast<double>(c.warmup_steps);
  const int64_t after = s - c.warmup_steps;
  const int64_t span = std::max<int64_t>(1, c.total_steps - c.warmup_steps);
  auto cosine = [&](double progress) {
    progress = std::clamp(progress, 0.0, 1.0);
    return min + 0.5 * (max - min) * (1.0 + std::cos(std::numbers::pi * progress));
  };
  if (c.kind == "cosine") return cosine(static_cast<double>(after) / static_cast<double>(span));
  if (c.kind == "sgdr") {
    double cycle = c.cycle_steps > 0 ? static_cast<double>(c.cycle_steps) : std::max<double>(1.0, span / 4.0);
    double pos = static_cast<double>(after);
    while (pos >= cycle) {
      pos -= cycle;
      cycle *= c.t_mult;
    }
    return cosine(pos / cycle);
  }
  // wsd
  const int64_t decay = static_cast<int64_t>(std::llround(c.decay_ratio * static_cast<double>(span)));
  const int64_t stable = span - decay;
  if (after < stable || decay == 0) return max;
  const double progress = static_cast<double>(after - stable + 1) / static_cast<double>(decay);
  return max + (min - max) * std::min(1.0, progress);
}

}  // namespace astrai::train
