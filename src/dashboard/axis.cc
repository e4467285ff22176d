#include "dashboard/axis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace astrai::dashboard {

double Axis::fraction(double value) const {
  const double v = log ? std::log10(value) : value;
  return hi > lo ? (v - lo) / (hi - lo) : 0.5;
}

namespace {

// 1, 2 or 5 × 10^k, the smallest at least `raw`.
double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw * (1 - 1e-9)) return m * p;
  return 10 * p;
}

// Drops trailing zeros of a fixed or mantissa string ("1.500" -> "1.5", "2.0" -> "2").
std::string trim_zeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

Axis linear_axis(double min, double max, int target, double min_step) {
  if (max - min <= std::fabs(max) * 1e-12) {  // one value: a range around it
    const double pad = min == 0 ? 1 : std::fabs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  const double step = std::max(min_step, nice_step((max - min) / std::max(1, target)));
  Axis a;
  a.lo = std::floor(min / step + 1e-9) * step;
  a.hi = std::ceil(max / step - 1e-9) * step;
  for (double t = a.lo; t <= a.hi + step * 1e-6; t += step) a.ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  const double magnitude = std::max(std::fabs(a.lo), std::fabs(a.hi));
  for (double v : a.ticks) a.labels.push_back(tick_label(v, step, magnitude));
  return a;
}

Axis log_axis(double min, double max, int target) {
  Axis a;
  a.log = true;
  a.lo = std::floor(std::log10(min) + 1e-9);
  a.hi = std::ceil(std::log10(max) - 1e-9);
  if (a.hi <= a.lo) a.hi = a.lo + 1;
  const int decades = static_cast<int>(a.hi - a.lo);
  const int every = std::max(1, (decades + target - 1) / std::max(1, target));
  for (int e = static_cast<int>(a.lo); e <= static_cast<int>(a.hi); e += every) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m > 1 && (decades > 2 || e == static_cast<int>(a.hi))) continue;
      const double v = m * std::pow(10.0, e);
      a.ticks.push_back(v);
      a.labels.push_back(tick_label(v, 0, v));
    }
  }
  return a;
}

}  // namespace

Axis make_axis(double min, double max, bool log, int target, double min_step) {
  return log ? log_axis(min, max, target) : linear_axis(min, max, target, min_step);
}

std::string tick_label(double value, double step, double magnitude) {
  if (value == 0) return "0";
  const double mag = std::fabs(value);
  char buf[64];
  if (magnitude >= 1e6 || magnitude < 1e-3) {
    const int e = static_cast<int>(std::floor(std::log10(mag) + 1e-9));
    const double mantissa = value / std::pow(10.0, e);
    // Enough mantissa digits to tell ticks `step` apart.
    const int digits = step > 0 ? std::clamp(e - static_cast<int>(std::floor(std::log10(step) + 1e-9)), 0, 6) : 0;
    std::snprintf(buf, sizeof buf, "%.*f", digits, mantissa);
    return trim_zeros(buf) + "e" + std::to_string(e);
  }
  const int decimals = step > 0 ? std::clamp(-static_cast<int>(std::floor(std::log10(step) + 1e-9)), 0, 9) : 3;
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return trim_zeros(buf);
}

}  // namespace astrai::dashboard
