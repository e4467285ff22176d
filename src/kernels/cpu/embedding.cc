#include "kernels/cpu/embedding.h"

#include <cstring>

#include "kernels/cpu/level_table.h"
#include "kernels/cpu/simd.h"

ASTRAI_KERNELS_BEGIN

namespace {

// dst[0, n) = src row widened to f32 (exact for bf16 and f16).
void widen_row(DType dtype, const void* src, int64_t n, float* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = n - i;
    vstore_n(dst + i, dtype == DType::kBF16 ? (k >= kLanes ? vload_bf16(s + i) : vload_bf16(s + i, k))
                                            : (k >= kLanes ? vload_f16(s + i) : vload_f16(s + i, k)),
             k);
  }
}

}  // namespace

void embedding(const void* table, DType dtype, int64_t dim, const int32_t* ids, int64_t n, float* out) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    const size_t row_bytes = dtype_bytes(dtype, dim);  // Q8_0 or f64 tables, or an error naming the dtype
    for (int64_t i = 0; i < n; ++i)
      convert_to_f32(dtype, static_cast<const uint8_t*>(table) + static_cast<size_t>(ids[i]) * row_bytes, out + i * dim,
                     static_cast<size_t>(dim));
    return;
  }
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(dtype);
  const auto* base = static_cast<const uint8_t*>(table);
#pragma omp parallel for schedule(static) if (n * dim > (1 << 16))
  for (int64_t i = 0; i < n; ++i) widen_row(dtype, base + static_cast<size_t>(ids[i]) * row_bytes, dim, out + i * dim);
}

void fill_embedding(KernelTable& t) { t.embedding = &embedding; }

ASTRAI_KERNELS_END
