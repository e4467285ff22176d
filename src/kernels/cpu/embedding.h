// Token embedding lookup: out[i, :] = table[ids[i], :] converted to f32.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace astrai::kernels {

// table: [vocab, dim] of f32/bf16/f16. ids must already be validated (< vocab).
void embedding(const void* table, DType dtype, int64_t dim, const int32_t* ids, int64_t n, float* out);

}  // namespace astrai::kernels
