#include "kernels/cpu/embedding.h"

namespace astrai::kernels {

void embedding(const void* table, DType dtype, int64_t dim, const int32_t* ids, int64_t n, float* out) {
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(dtype);
  const auto* base = static_cast<const uint8_t*>(table);
#pragma omp parallel for schedule(static) if (n * dim > (1 << 16))
  for (int64_t i = 0; i < n; ++i)
    convert_to_f32(dtype, base + static_cast<size_t>(ids[i]) * row_bytes, out + i * dim, static_cast<size_t>(dim));
}

}  // namespace astrai::kernels
