// Element types and the f32 <-> bf16/f16 conversions every layer shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace astrai {

// kQ8_0 and kQ4_0 are block types (llama.cpp's Q8_0 and Q4_0 layouts): blocks of 32 elements
// along the last dimension, each an f16 scale d followed by the quants.
//   Q8_0, 34 bytes: 32 int8 q; element i is float(q[i]) * float(d).
//   Q4_0, 18 bytes: 16 bytes qs of two 4-bit quants; element i < 16 is ((qs[i] & 15) - 8) * d,
//   element 16 + i is ((qs[i] >> 4) - 8) * d.
// f32 holds every element exactly (a small integer times an 11-bit mantissa).
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kI8, kU16, kBool, kF64, kQ8_0, kQ4_0 };

constexpr int64_t kQBlock = 32;        // elements per block of a block type
constexpr int64_t kQ8BlockBytes = 34;  // f16 scale + 32 int8
constexpr int64_t kQ4BlockBytes = 18;  // f16 scale + 32 nibbles
constexpr bool is_block_type(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0; }

// Bytes of one element; an error for block types (use dtype_bytes).
size_t dtype_size(DType t);
// Elements per block: 1, or 32 for the block types.
int64_t dtype_block(DType t);
// Bytes of n elements (n a multiple of the block for block types).
size_t dtype_bytes(DType t, int64_t n);
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

// Bulk conversions (vectorised where the CPU allows). For the block types n is a multiple of
// 32; converting to one quantizes as llama.cpp's reference quantize_row_q8_0 / q4_0 does, bit
// for bit (quantize_q8_0_block, quantize_q4_0_block).
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);
void convert_from_f32(const float* src, DType dst_type, void* dst, size_t n);

// One Q8_0 block of x[0..32): d = max|x| / 127 (f32), q = roundf(x * (1 / d)) (0 where d = 0),
// the scale stored as f16(d).
void quantize_q8_0_block(const float* x, uint8_t* block);
// One Q4_0 block of x[0..32): m = the element of largest magnitude (the first such), d = m / -8,
// q = min(15, int(x * (1 / d) + 8.5)) (truncated; 8 where d = 0), the scale stored as f16(d).
void quantize_q4_0_block(const float* x, uint8_t* block);

}  // namespace astrai
