// The level's table of entry points (compiled once per level, like every kernel source).
#include "kernels/cpu/level_table.h"

ASTRAI_KERNELS_BEGIN

namespace {

KernelTable make_table() {
  KernelTable t{};
#if defined(ASTRAI_ISA_V4)
  t.isa = Isa::kV4;
#elif defined(ASTRAI_ISA_V3)
  t.isa = Isa::kV3;
#elif defined(ASTRAI_ISA_NEON)
  t.isa = Isa::kNeon;
#else
  t.isa = Isa::kGeneric;
#endif
  fill_activation(t);
  fill_attention(t);
  fill_attention_backward(t);
  fill_cross_entropy(t);
  fill_embedding(t);
  fill_linear(t);
  fill_linear_backward(t);
  fill_peak(t);
  fill_rmsnorm(t);
  fill_rmsnorm_backward(t);
  fill_rope(t);
  fill_softmax(t);
  fill_swiglu_backward(t);
  return t;
}

}  // namespace

const KernelTable& table() {
  static const KernelTable t = make_table();
  return t;
}

ASTRAI_KERNELS_END
