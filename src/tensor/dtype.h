// Element types and the f32 <-> bf16/f16 conversions every layer shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace astrai {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kI8, kU16, kBool, kF64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype string; returns false for unknown names.
bool dtype_from_name(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round-to-nearest-even, NaN preserved (what PyTorch's .to(torch.bfloat16) does).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round-to-nearest-even, IEEE half

// Bulk conversions (vectorised where the CPU allows).
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);
void convert_from_f32(const float* src, DType dst_type, void* dst, size_t n);

}  // namespace astrai
