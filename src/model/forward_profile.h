// Optional per-operation wall-clock profile of the forward pass. Off by default (no clock
// reads); a benchmark turns it on in its ForwardWorkspace and reads where a step's time goes.
//
//   ws.profile.enabled = true; model.forward(...); std::puts(ws.profile.table().c_str());
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace astrai::model {

enum class ForwardOp : int {
  kEmbed,      // token embedding lookup, RoPE tables
  kNorm,       // RMSNorms (layer inputs, qk-norm, MLA latent, final), with the attention residual add fused in
  kQkvProj,    // q/k/v (or MLA) projections
  kRope,       // rotary embedding of q and k
  kKvWrite,    // copying new K/V rows into their cache pages
  kAttention,  // the attention kernel
  kOutProj,    // o_proj (and the output gate)
  kMlpIn,      // gate_proj + up_proj
  kSwiglu,     // silu(gate) * up
  kMlpDown,    // down_proj
  kResidual,   // the residual add after each MLP
  kLmHead,     // gathering logit rows + LM head
  kCount
};

struct ForwardProfile {
  bool enabled = false;
  std::array<double, static_cast<size_t>(ForwardOp::kCount)> seconds{};
  int64_t forwards = 0;

  void reset() {
    seconds.fill(0.0);
    forwards = 0;
  }
  double total() const;
  static const char* name(ForwardOp op);
  // One line per operation: name, ms per forward, share of the total.
  std::string table() const;
};

// Charges the time since the previous mark to an operation (no-op when disabled).
class ForwardClock {
 public:
  explicit ForwardClock(ForwardProfile& p) : p_(p.enabled ? &p : nullptr) {
    if (p_) {
      ++p_->forwards;
      last_ = std::chrono::steady_clock::now();
    }
  }
  void mark(ForwardOp op) {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    p_->seconds[static_cast<size_t>(op)] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  ForwardProfile* p_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace astrai::model
