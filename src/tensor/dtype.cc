#include "tensor/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"

namespace astrai {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;       // bytes of a block
  int64_t block = 1;  // elements of a block
};
constexpr DTypeInfo kInfos[] = {
    {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2}, {DType::kI32, "I32", 4},
    {DType::kI64, "I64", 8}, {DType::kU8, "U8", 1},   {DType::kI8, "I8", 1},     {DType::kU16, "U16", 2},
    {DType::kBool, "BOOL", 1}, {DType::kF64, "F64", 8}, {DType::kQ8_0, "Q8_0", kQ8BlockBytes, kQBlock},
    {DType::kQ4_0, "Q4_0", kQ4BlockBytes, kQBlock},
};
}  // namespace

size_t dtype_size(DType t) {
  const DTypeInfo& info = kInfos[static_cast<int>(t)];
  ASTRAI_CHECK(info.block == 1, "dtype_size: ", info.name, " is a block type (", info.block, " elements per block)");
  return info.size;
}

int64_t dtype_block(DType t) { return kInfos[static_cast<int>(t)].block; }

size_t dtype_bytes(DType t, int64_t n) {
  const DTypeInfo& info = kInfos[static_cast<int>(t)];
  ASTRAI_CHECK(n % info.block == 0, n, " elements of ", info.name, " are not whole blocks of ", info.block);
  return static_cast<size_t>(n / info.block) * info.size;
}

void quantize_q8_0_block(const float* x, uint8_t* block) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kQBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(block, &dh, 2);
  for (int64_t i = 0; i < kQBlock; ++i) block[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[i] * id)));
}
void quantize_q4_0_block(const float* x, uint8_t* block) {
  float amax = 0.0f, max = 0.0f;
  for (int64_t i = 0; i < kQBlock; ++i) {
    if (amax < std::fabs(x[i])) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(block, &dh, 2);
  for (int64_t j = 0; j < kQBlock / 2; ++j) {
    const auto q = [&](float v) { return static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(v * id + 8.5f)))); };
    block[2 + j] = static_cast<uint8_t>(q(x[j]) | (q(x[kQBlock / 2 + j]) << 4));
  }
}

std::string_view dtype_name(DType t) { return kInfos[static_cast<int>(t)].name; }

bool dtype_from_name(std::string_view name, DType* out) {
  for (const auto& info : kInfos) {
    if (info.name == name) {
      *out = info.type;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (incl. inf) after rounding
  if (abs < 0x38800000u) {                         // result is subnormal or zero
    if (abs < 0x33000000u) return sign;            // below half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 - (e - 112)
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

void convert_to_f32(DType src_type, const void* src, float* dst, size_t n) {
  switch (src_type) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF64: {
      const auto* s = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kQ4_0: {
      ASTRAI_CHECK(n % kQBlock == 0, "Q4_0: ", n, " elements are not whole blocks of ", kQBlock);
      const auto* b = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; i += kQBlock, b += kQ4BlockBytes) {
        uint16_t dh;
        std::memcpy(&dh, b, 2);
        const float d = f16_to_f32(dh);
        for (int64_t j = 0; j < kQBlock / 2; ++j) {
          dst[i + j] = static_cast<float>((b[2 + j] & 15) - 8) * d;
          dst[i + kQBlock / 2 + j] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case DType::kQ8_0: {
      ASTRAI_CHECK(n % kQBlock == 0, "Q8_0: ", n, " elements are not whole blocks of ", kQBlock);
      const auto* b = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; i += kQBlock, b += kQ8BlockBytes) {
        uint16_t dh;
        std::memcpy(&dh, b, 2);
        const float d = f16_to_f32(dh);
        for (int64_t j = 0; j < kQBlock; ++j) dst[i + j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
      }
      return;
    }
    default:
      fail("cannot convert ", dtype_name(src_type), " to F32");
  }
}

void convert_from_f32(const float* src, DType dst_type, void* dst, size_t n) {
  switch (dst_type) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kQ4_0: {
      ASTRAI_CHECK(n % kQBlock == 0, "Q4_0: ", n, " elements are not whole blocks of ", kQBlock);
      auto* b = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; i += kQBlock, b += kQ4BlockBytes) quantize_q4_0_block(src + i, b);
      return;
    }
    case DType::kQ8_0: {
      ASTRAI_CHECK(n % kQBlock == 0, "Q8_0: ", n, " elements are not whole blocks of ", kQBlock);
      auto* b = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; i += kQBlock, b += kQ8BlockBytes) quantize_q8_0_block(src + i, b);
      return;
    }
    default:
      fail("cannot convert F32 to ", dtype_name(dst_type));
  }
}

}  // namespace astrai
