#include "model/forward_profile.h"

#include <cstdio>

namespace astrai::model {

double ForwardProfile::total() const {
  double t = 0;
  for (double s : seconds) t += s;
  return t;
}

const char* ForwardProfile::name(ForwardOp op) {
  switch (op) {
    case ForwardOp::kEmbed: return "embedding";
    case ForwardOp::kNorm: return "rmsnorm";
    case ForwardOp::kQkvProj: return "qkv proj";
    case ForwardOp::kRope: return "rope";
    case ForwardOp::kKvWrite: return "kv write";
    case ForwardOp::kAttention: return "attention";
    case ForwardOp::kOutProj: return "o proj";
    case ForwardOp::kMlpIn: return "gate+up proj";
    case ForwardOp::kSwiglu: return "swiglu";
    case ForwardOp::kMlpDown: return "down proj";
    case ForwardOp::kResidual: return "residual";
    case ForwardOp::kLmHead: return "lm head";
    case ForwardOp::kCount: break;
  }
  return "?";
}

std::string ForwardProfile::table() const {
  std::string out;
  const double tot = total();
  const double per = forwards > 0 ? 1e3 / static_cast<double>(forwards) : 0.0;
  char line[96];
  for (size_t i = 0; i < seconds.size(); ++i) {
    if (seconds[i] == 0.0) continue;
    std::snprintf(line, sizeof line, "  %-13s %9.3f ms %6.1f%%\n", name(static_cast<ForwardOp>(i)), seconds[i] * per,
                  tot > 0 ? 100.0 * seconds[i] / tot : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-13s %9.3f ms per forward (%ld forwards)\n", "total", tot * per,
                static_cast<long>(forwards));
  return out + line;
}

}  // namespace astrai::model
