// Elementwise activations of the forward pass.
#pragma once

#include <cstdint>

namespace astrai::kernels {

// out[i] = silu(gate[i]) * up[i], silu(x) = x * sigmoid(x). out may alias gate or up.
void swiglu(const float* gate, const float* up, int64_t n, float* out);

// x[i] *= sigmoid(g[i]) (the attention output gate).
void mul_sigmoid(float* x, const float* g, int64_t n);

// y[i] += x[i] (residual connection).
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace astrai::kernels
