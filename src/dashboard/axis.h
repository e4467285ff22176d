// Axis ranges and tick marks with readable labels for the plots: linear axes step by
// 1, 2 or 5 × 10^k; log axes by powers of ten (and 2 and 5 times them over at most two decades). Labels: plain decimals ("0.25", "1200"), or
// compact exponents for very large or small magnitudes ("3e-4", "1.5e6").
#pragma once

#include <string>
#include <vector>

namespace astrai::dashboard {

struct Axis {
  double lo = 0, hi = 1;     // the axis' ends (log axes: log10 of them)
  bool log = false;
  std::vector<double> ticks;  // values (not log10) in [lo, hi]
  std::vector<std::string> labels;

  // 0 at lo .. 1 at hi.
  double fraction(double value) const;
};

// An axis covering [min, max] with about `target` ticks, at least `min_step` apart (1 for
// update steps: no tick at step 2.5). log: min must be > 0.
Axis make_axis(double min, double max, bool log, int target = 5, double min_step = 0);

// `value` written for a tick label, the ticks being `step` apart (0: a log axis' tick). Plain
// decimals unless `magnitude` (the axis' largest |tick|; on log axes the value itself) is
// >= 1e6 or < 1e-3: then a compact exponent.
std::string tick_label(double value, double step, double magnitude);

}  // namespace astrai::dashboard
