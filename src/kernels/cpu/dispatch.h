// The table of CPU kernel entry points, one per instruction-set level, and the level in use.
//
// The public kernel functions (kernels::linear, kernels::attention, ...) call the active
// level's entry. The level is chosen once: the highest this CPU supports, unless
// ASTRAI_CPU_ISA (auto|generic|v3|v4|neon) or select_isa() (the CLI's --cpu-isa) asks for
// another; asking for a level the CPU lacks is an error. Every level gives the same bits
// (docs/architecture.md, "CPU levels"), so the choice changes speed, never results.
#pragma once

#include <string_view>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/cross_entropy_backward.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm_mode.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_backward.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/peak.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rmsnorm_backward.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/swiglu_backward.h"

namespace astrai::kernels {

// Each member has the type of the public function of the same name.
struct KernelTable {
  Isa isa;
  decltype(&kernels::linear) linear;
  decltype(&kernels::linear_group) linear_group;
  decltype(&kernels::bf16_dot_native) bf16_dot_native;
  decltype(&kernels::attention) attention;
  decltype(&kernels::rmsnorm) rmsnorm;
  decltype(&kernels::add_rmsnorm) add_rmsnorm;
  decltype(&kernels::rope_sincos) rope_sincos;
  decltype(&kernels::rope_rotate) rope_rotate;
  decltype(&kernels::swiglu) swiglu;
  decltype(&kernels::mul_sigmoid) mul_sigmoid;
  decltype(&kernels::add_inplace) add_inplace;
  decltype(&kernels::embedding) embedding;
  decltype(&kernels::exp_values) exp_values;
  decltype(&kernels::logsumexp) logsumexp;
  decltype(&kernels::log_softmax) log_softmax;
  decltype(&kernels::softmax) softmax;
  decltype(&kernels::cross_entropy_forward_backward) cross_entropy_forward_backward;
  decltype(&kernels::token_logprobs) token_logprobs;
  decltype(&kernels::token_logprobs_backward) token_logprobs_backward;
  decltype(&kernels::swiglu_backward) swiglu_backward;
  decltype(&kernels::sigmoid_forward) sigmoid_forward;
  decltype(&kernels::rmsnorm_forward_train) rmsnorm_forward_train;
  decltype(&kernels::rmsnorm_backward) rmsnorm_backward;
  decltype(&kernels::attention_forward_train) attention_forward_train;
  decltype(&kernels::attention_backward) attention_backward;
  decltype(&kernels::linear_backward_f32) linear_backward_f32;
  PeakLoops peak;  // the arithmetic peak probe's loops (peak.h); last: the entries above are all pointers
};

// The table of one level; throws astrai::Error if the level is not compiled in or this CPU
// cannot run it. Tests call levels side by side through this.
const KernelTable& kernel_table(Isa isa);

// The level in use. The first call settles it from ASTRAI_CPU_ISA (default auto) and logs it;
// a bad value throws astrai::Error, as does any later kernel call.
Isa active_isa();

// Uses `name` (auto|generic|v3|v4|neon) from now on and logs it; throws astrai::Error for an
// unknown name or a level this CPU cannot run. Call it before any kernel runs (the CLI does,
// for --cpu-isa).
void select_isa(std::string_view name);

}  // namespace astrai::kernels
