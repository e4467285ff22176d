// Element types and the f32 <-> bf16/f16 conversions every layer shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace astrai {

// kQ8_0, kQ4_0, kQ4_K, kQ5_K and kQ6_K are block types (llama.cpp's Q8_0, Q4_0, Q4_K, Q5_K and
// Q6_K layouts, byte for byte): blocks of elements along the last dimension.
//   Q8_0, 32 elements, 34 bytes: f16 d, 32 int8 q; element i is float(q[i]) * float(d).
//   Q4_0, 32 elements, 18 bytes: f16 d, 16 bytes qs of two 4-bit quants; element i < 16 is
//   ((qs[i] & 15) - 8) * d, element 16 + i is ((qs[i] >> 4) - 8) * d.
//   Q4_K, 256 elements (a super-block of 8 sub-blocks of 32), 144 bytes: f16 d, f16 dmin, 12
//   bytes of 6-bit sub-block scales sc[8] and mins m[8] (q4_k_scale_min), 128 bytes qs. Element
//   64 c + i (c < 4, i < 32) is (d * sc[2c]) * (qs[32 c + i] & 15) - dmin * m[2c], element
//   64 c + 32 + i is (d * sc[2c + 1]) * (qs[32 c + i] >> 4) - dmin * m[2c + 1].
//   Q5_K, 256 elements, 176 bytes: Q4_K's d, dmin and 12 scale bytes, then qh[32] (the fifth
//   bits), then qs[128] as Q4_K's (the low 4 bits). Element 64 c + i takes q = (qs[32 c + i] & 15)
//   | (bit 2c of qh[i]) << 4 with sub-block 2c's scale and min, element 64 c + 32 + i q =
//   (qs[32 c + i] >> 4) | (bit 2c + 1 of qh[i]) << 4 with sub-block 2c + 1's; q5_k_quant.
//   Element value (d * sc) * q - dmin * m as Q4_K's.
//   Q6_K, 256 elements (16 sub-blocks of 16), 210 bytes: ql[128] (low 4 bits of each quant),
//   qh[64] (high 2 bits), int8 scales[16] (one per 16 elements), f16 d last. Element e is
//   (d * scales[e / 16]) * (q - 32), q the 6-bit value q6_k_quant assembles (two halves of 128
//   elements, each from 64 bytes of ql and 32 of qh).
// f32 holds every element exactly for Q8_0 and Q4_0 (a small integer times an 11-bit mantissa);
// for Q4_K and Q5_K the products are exact (11 + 6 + 5 bits) and only the final subtraction
// rounds; for
// Q6_K both products are exact too (d * scale * (q - 32) has at most 11 + 7 + 5 significant
// bits: 2047 * 127 * 31 < 2^24, and -128, -32 are powers of two), so every element is exact.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kI8, kU16, kBool, kF64, kQ8_0, kQ4_0, kQ4_K, kQ6_K, kQ5_K };

constexpr int64_t kQBlock = 32;         // elements per block of Q8_0 and Q4_0 (and per Q4_K sub-block)
constexpr int64_t kQ8BlockBytes = 34;   // f16 scale + 32 int8
constexpr int64_t kQ4BlockBytes = 18;   // f16 scale + 32 nibbles
constexpr int64_t kQKBlock = 256;       // elements per Q4_K / Q5_K / Q6_K super-block
constexpr int64_t kQ4KBlockBytes = 144; // f16 d + f16 dmin + 12 bytes of scales/mins + 256 nibbles
constexpr int64_t kQ4KScalesAt = 4;     // byte offset of the packed scales in a Q4_K block
constexpr int64_t kQ4KQuantsAt = 16;    // byte offset of the quants
constexpr int64_t kQ5KBlockBytes = 176; // Q4_K's 16 bytes of d, dmin and scales + 32 bytes qh + 128 bytes qs
constexpr int64_t kQ5KHighAt = 16;      // byte offset of qh in a Q5_K block
constexpr int64_t kQ5KQuantsAt = 48;    // of qs
constexpr int64_t kQ6KBlockBytes = 210; // 128 bytes ql + 64 bytes qh + 16 int8 scales + f16 d
constexpr int64_t kQ6KHighAt = 128;     // byte offset of qh in a Q6_K block (ql at 0)
constexpr int64_t kQ6KScalesAt = 192;   // of the int8 scales
constexpr int64_t kQ6KDAt = 208;        // of the f16 d
constexpr bool is_block_type(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
}
// The k-quants: super-blocks of 256.
constexpr bool is_k_quant(DType t) { return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K; }
// Elements and bytes of one block of a block type (1 and 0 for the others: see dtype_size).
constexpr int64_t block_elems(DType t) {
  return is_k_quant(t) ? kQKBlock : is_block_type(t) ? kQBlock : 1;
}
constexpr int64_t block_bytes(DType t) {
  return t == DType::kQ8_0   ? kQ8BlockBytes
         : t == DType::kQ4_0 ? kQ4BlockBytes
         : t == DType::kQ4_K ? kQ4KBlockBytes
         : t == DType::kQ5_K ? kQ5KBlockBytes
         : t == DType::kQ6_K ? kQ6KBlockBytes
                             : 0;
}

// Sub-block j (< 8) of a Q4_K block's 12 packed scale bytes: its 6-bit scale and min. Bytes 0-3
// hold sc[0..3] in their low 6 bits, bytes 4-7 m[0..3]; for j >= 4 the low 4 bits of sc[j] are
// the low nibble of byte j + 4 and the high 2 bits the top bits of byte j - 4; m[j]'s low 4 are
// the high nibble of byte j + 4, its high 2 the top bits of byte j.
inline void q4_k_scale_min(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// The 5-bit quant (0..31) of element e (< 256) of a Q5_K block: element 64 c + 32 t + i (c < 4,
// t < 2, i < 32) takes its low 4 bits from nibble t of byte 32 c + i of qs and its fifth bit from
// bit 2c + t of byte i of qh.
inline int q5_k_quant(const uint8_t* block, int e) {
  const int c = e / 64, t = e % 64 / 32, i = e % 32;
  const int lo = (block[kQ5KQuantsAt + 32 * c + i] >> (4 * t)) & 15;
  const int hi = (block[kQ5KHighAt + i] >> (2 * c + t)) & 1;
  return lo | (hi << 4);
}

// The 6-bit quant (0..63) of element e (< 256) of a Q6_K block: element 128 c + 32 t + i (c < 2,
// t < 4, i < 32) takes its low 4 bits from byte 64 c + 32 (t % 2) + i of ql (the low nibble for
// t < 2, the high one for t >= 2) and its high 2 bits from bits 2t, 2t + 1 of byte 32 c + i of qh.
inline int q6_k_quant(const uint8_t* block, int e) {
  const int c = e / 128, t = e % 128 / 32, i = e % 32;
  const int lo = (block[64 * c + 32 * (t % 2) + i] >> (4 * (t / 2))) & 15;
  const int hi = (block[kQ6KHighAt + 32 * c + i] >> (2 * t)) & 3;
  return lo | (hi << 4);
}

// Bytes of one element; an error for block types (use dtype_bytes).
size_t dtype_size(DType t);
// Elements per block: 1, 32 for Q8_0 and Q4_0, 256 for the k-quants.
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
// the block; converting to one quantizes as llama.cpp's reference quantize_row_q8_0 / q4_0 /
// q4_K / q5_K / q6_K does, bit for bit (quantize_q8_0_block, ..., quantize_q6_k_block).
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);
void convert_from_f32(const float* src, DType dst_type, void* dst, size_t n);

// One Q8_0 block of x[0..32): d = max|x| / 127 (f32), q = roundf(x * (1 / d)) (0 where d = 0),
// the scale stored as f16(d).
void quantize_q8_0_block(const float* x, uint8_t* block);
// One Q4_0 block of x[0..32): m = the element of largest magnitude (the first such), d = m / -8,
// q = min(15, int(x * (1 / d) + 8.5)) (truncated; 8 where d = 0), the scale stored as f16(d).
void quantize_q4_0_block(const float* x, uint8_t* block);
// One Q4_K block of x[0..256), byte for byte what llama.cpp's quantize_row_q4_K_ref writes:
// per sub-block of 32 a weighted least-squares fit x ~ scale * q - min (q in [0, 15], weights
// sqrt(mean x^2) + |x|; the plain min/max fit, then 21 candidate grids searched), the 8 scales
// and 8 mins quantized to 6 bits against d = max scale / 63 and dmin = max min / 63 (stored
// as f16), the quants recomputed against the stored scales. Rounding is round-half-even
// (llama.cpp's nearest_int) throughout. docs/quantization.md has the steps.
void quantize_q4_k_block(const float* x, uint8_t* block);
// The 256 elements of a Q4_K block: (d * sc) * q - dmin * m (llama.cpp's dequantize_row_q4_K).
void dequantize_q4_k_block(const uint8_t* block, float* y);
// One Q5_K block of x[0..256), byte for byte what llama.cpp's quantize_row_q5_K_ref writes: Q4_K's
// steps with q in [0, 31] (the fit searches 16 grids from rmin = -0.5 instead of 21 from -1).
void quantize_q5_k_block(const float* x, uint8_t* block);
// The 256 elements of a Q5_K block: (d * sc) * q - dmin * m (llama.cpp's dequantize_row_q5_K).
void dequantize_q5_k_block(const uint8_t* block, float* y);
// One Q6_K block of x[0..256), byte for byte what llama.cpp's quantize_row_q6_K_ref writes: per
// sub-block of 16 a signed scale from llama.cpp's make_qx_quants (nmax 32, weights x^2: the
// grid through the element of largest magnitude, then 18 neighbouring grids searched by
// least squares), the 16 scales quantized to int8 against d = max scale / -128 (the scale of
// largest magnitude; stored as f16), the quants recomputed against the stored scales, q =
// clamp(round(x / (d * scale)), -32, 31) + 32. Blocks whose scales are all below 1e-15 are all
// zero bytes. Rounding is round-half-even (llama.cpp's nearest_int). docs/quantization.md.
void quantize_q6_k_block(const float* x, uint8_t* block);
// The 256 elements of a Q6_K block: (d * scale) * (q - 32) (gguf-py's and llama.cpp's
// dequantize_row_q6_K order; exact in f32, see above).
void dequantize_q6_k_block(const uint8_t* block, float* y);

}  // namespace astrai
