// SwiGLU for training: h = silu(a) ∘ b (a = gate_proj x, b = up_proj x), and its backward.
#pragma once

#include <cstdint>

namespace astrai::kernels {

void swiglu_forward_train(const float* a, const float* b, int64_t n, float* h);
// da = dh ∘ b ∘ silu'(a), db = dh ∘ silu(a) (overwritten).
void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da, float* db);

// g = sigmoid(x) elementwise (the attention output gate).
void sigmoid_forward(const float* x, int64_t n, float* g);

}  // namespace astrai::kernels
