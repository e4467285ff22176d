// The backward of SwiGLU (kernels::swiglu, activation.h: h = silu(a) ∘ b, a = gate_proj x,
// b = up_proj x), and the attention gate's sigmoid for training.
#pragma once

#include <cstdint>

namespace astrai::kernels {

// da = dh ∘ b ∘ silu'(a), db = dh ∘ silu(a) (overwritten).
void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da, float* db);

// g = sigmoid(x) elementwise (the attention output gate), the sigmoid of kernels::mul_sigmoid:
// x ∘ g here has the bits of mul_sigmoid(x, z).
void sigmoid_forward(const float* x, int64_t n, float* g);

}  // namespace astrai::kernels
