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
    {DType::kQ4_0, "Q4_0", kQ4BlockBytes, kQBlock}, {DType::kQ4_K, "Q4_K", kQ4KBlockBytes, kQKBlock},
    {DType::kQ6_K, "Q6_K", kQ6KBlockBytes, kQKBlock}, {DType::kQ5_K, "Q5_K", kQ5KBlockBytes, kQKBlock},
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

namespace {

// Round to nearest, ties to even, as llama.cpp's nearest_int computes it: v + 1.5 * 2^23 lands
// in [2^23, 2^24), where the float spacing is 1, so the addition rounds v to an integer, kept in
// the low mantissa bits. Exact for |v| < 2^22; any other v (and NaN) gives the same garbage as
// llama.cpp's, which byte equality needs.
int nearest_even(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

// The fit of one Q4_K / Q5_K sub-block (llama.cpp's make_qkx2_quants with n = 32, rdelta = 0.1,
// squared error; Q4_K: nmax = 15, rmin = -1, nstep = 20; Q5_K: nmax = 31, rmin = -0.5, nstep =
// 15): x[i] ~ scale * L[i] + lo with L[i] in [0, nmax] and lo <= 0, minimising sum w[i] * err^2.
// Returns scale, *neg_lo = -lo. The expressions keep llama.cpp's order of f32 operations (this
// file is compiled without FMA contraction).
float qkx2_fit(const float* x, const float* w, int nmax, float rmin, int nstep, uint8_t* L, float* neg_lo) {
  constexpr int n = 32;
  constexpr float rdelta = 0.1f;
  float lo = x[0], hi = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_lo = -lo;
    return 0.0f;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_even(iscale * (x[i] - lo)))));
    float diff = scale * L[i] + lo - x[i];
    diff = diff * diff;
    best += w[i] * diff;
  }
  uint8_t cand[n];
  // lo is the best candidate's so far: later grids are laid from it (as in llama.cpp).
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_even(iscale * (x[i] - lo))));
      cand[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float s = (sum_w * sum_xl - sum_x * sum_l) / det;
      float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (m > 0) {
        m = 0;
        s = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = s * cand[i] + m - x[i];
        diff = diff * diff;
        err += w[i] * diff;
      }
      if (err < best) {
        std::memcpy(L, cand, n);
        best = err;
        scale = s;
        lo = m;
      }
    }
  }
  *neg_lo = -lo;
  return scale;
}

// The quants L[0..256) of a Q4_K (nmax 15) or Q5_K (nmax 31) block of x, and its d, dmin and
// packed scales written to block[0..16): llama.cpp's quantize_row_q4_K_ref / q5_K_ref up to the
// packing of the quants, which differs.
void quantize_k_scaled(const float* x, int nmax, float rmin, int nstep, uint8_t* L, uint8_t* block) {
  constexpr int kSub = kQKBlock / kQBlock;  // 8 sub-blocks
  float scales[kSub], mins[kSub], w[kQBlock];
  float max_scale = 0, max_min = 0;  // the mins are subtracted, so scales are positive
  for (int j = 0; j < kSub; ++j) {
    const float* xj = x + kQBlock * j;
    float sum_x2 = 0;
    for (int i = 0; i < kQBlock; ++i) sum_x2 += xj[i] * xj[i];
    const float av_x = std::sqrt(sum_x2 / kQBlock);
    for (int i = 0; i < kQBlock; ++i) w[i] = av_x + std::fabs(xj[i]);
    scales[j] = qkx2_fit(xj, w, nmax, rmin, nstep, L + kQBlock * j, &mins[j]);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t* packed = block + kQ4KScalesAt;
  std::memset(packed, 0, 12);
  for (int j = 0; j < kSub; ++j) {
    // The int result is narrowed to 8 bits before the clamp (a negative scale wraps, then clamps to 63).
    const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_even(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_even(inv_min * mins[j])));
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 15) | ((lm & 15) << 4));
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  const uint16_t dh = f32_to_f16(max_scale / 63.0f), dminh = f32_to_f16(max_min / 63.0f);
  std::memcpy(block, &dh, 2);
  std::memcpy(block + 2, &dminh, 2);
  // The quants again, against the scales as stored; a sub-block whose scale is 0 keeps its fit's.
  for (int j = 0; j < kSub; ++j) {
    int sc, m;
    q4_k_scale_min(packed, j, &sc, &m);
    const float d = f16_to_f32(dh) * sc;
    if (d == 0.0f) continue;
    const float dm = f16_to_f32(dminh) * m;
    for (int i = 0; i < kQBlock; ++i)
      L[kQBlock * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_even((x[kQBlock * j + i] + dm) / d))));
  }
}

}  // namespace

void quantize_q4_k_block(const float* x, uint8_t* block) {
  uint8_t L[kQKBlock];
  quantize_k_scaled(x, 15, -1.0f, 20, L, block);
  // Each 64 elements are 32 bytes: the first 32 in the low nibbles, the next 32 in the high ones.
  uint8_t* qs = block + kQ4KQuantsAt;
  for (int c = 0; c < kQKBlock / 64; ++c)
    for (int i = 0; i < 32; ++i) qs[32 * c + i] = static_cast<uint8_t>(L[64 * c + i] | (L[64 * c + 32 + i] << 4));
}

void quantize_q5_k_block(const float* x, uint8_t* block) {
  uint8_t L[kQKBlock];
  quantize_k_scaled(x, 31, -0.5f, 15, L, block);
  // Q4_K's nibble layout for the low 4 bits; bit 2c (2c + 1) of qh[i] is the fifth bit of
  // element 64 c + i (64 c + 32 + i).
  uint8_t* qh = block + kQ5KHighAt;
  uint8_t* qs = block + kQ5KQuantsAt;
  std::memset(qh, 0, 32);
  for (int c = 0; c < kQKBlock / 64; ++c)
    for (int i = 0; i < 32; ++i) {
      const int l1 = L[64 * c + i], l2 = L[64 * c + 32 + i];
      qs[32 * c + i] = static_cast<uint8_t>((l1 & 15) | ((l2 & 15) << 4));
      qh[i] |= static_cast<uint8_t>(((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1)));
    }
}

void dequantize_q5_k_block(const uint8_t* block, float* y) {
  uint16_t dh, dminh;
  std::memcpy(&dh, block, 2);
  std::memcpy(&dminh, block + 2, 2);
  const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
  for (int j = 0; j < kQKBlock / kQBlock; ++j) {
    int sc, m;
    q4_k_scale_min(block + kQ4KScalesAt, j, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    for (int i = 0; i < kQBlock; ++i) y[kQBlock * j + i] = d1 * static_cast<float>(q5_k_quant(block, kQBlock * j + i)) - m1;
  }
}

void dequantize_q4_k_block(const uint8_t* block, float* y) {
  uint16_t dh, dminh;
  std::memcpy(&dh, block, 2);
  std::memcpy(&dminh, block + 2, 2);
  const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
  const uint8_t* qs = block + kQ4KQuantsAt;
  for (int j = 0; j < kQKBlock / kQBlock; ++j) {
    int sc, m;
    q4_k_scale_min(block + kQ4KScalesAt, j, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    const int shift = (j & 1) * 4;
    for (int i = 0; i < kQBlock; ++i)
      y[kQBlock * j + i] = d1 * static_cast<float>((qs[32 * (j / 2) + i] >> shift) & 15) - m1;
  }
}

namespace {

// A Q6_K sub-block's signed scale (llama.cpp's make_qx_quants with n = 16, nmax = 32,
// rmse_type 1, no importance weights): x[i] ~ scale * l[i], l in [-32, 31], weights x[i]^2.
// L[i] = l[i] + 32. The first grid puts the element of largest magnitude (the first such) at
// -32; then grids of -(32 + 0.1 is) / max for is = -9..9 (not 0) are tried, each with its
// least-squares scale, and kept when sum(w x l)^2 / sum(w l^2) beats the best so far. The
// expressions keep llama.cpp's order of f32 operations.
float q6_k_fit(const float* x, uint8_t* L) {
  constexpr int n = 16, nmax = 32;
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {  // llama.cpp's GROUP_MAX_EPS: all zero (the quants stay 0, not 32)
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const auto quant = [&](float iscale, int i) { return std::max(-nmax, std::min(nmax - 1, nearest_even(iscale * x[i]))); };
  float iscale = -nmax / max;
  float sum_lx = 0, sum_l2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = quant(iscale, i);
    L[i] = static_cast<uint8_t>(l + nmax);
    const float w = x[i] * x[i];
    sum_lx += w * x[i] * l;
    sum_l2 += w * l * l;
  }
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sum_lx = sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = quant(iscale, i);
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * l;
      sum_l2 += w * l * l;
    }
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(quant(iscale, i) + nmax);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

}  // namespace

void quantize_q6_k_block(const float* x, uint8_t* block) {
  constexpr int kSub = kQKBlock / 16;  // 16 sub-blocks of 16
  uint8_t L[kQKBlock];
  float scales[kSub];
  float max_scale = 0, max_abs_scale = 0;  // the scale of largest magnitude (the first such), signed
  for (int j = 0; j < kSub; ++j) {
    scales[j] = q6_k_fit(x + 16 * j, L + 16 * j);
    const float a = std::fabs(scales[j]);
    if (a > max_abs_scale) {
      max_abs_scale = a;
      max_scale = scales[j];
    }
  }
  std::memset(block, 0, kQ6KBlockBytes);
  if (max_abs_scale < 1e-15f) return;  // all zero bytes (d = +0)
  const float iscale = -128.0f / max_scale;
  const uint16_t dh = f32_to_f16(1 / iscale);
  std::memcpy(block + kQ6KDAt, &dh, 2);
  auto* sc = reinterpret_cast<int8_t*>(block + kQ6KScalesAt);
  // The int result narrowed to int8 as C's conversion does (the range is [-128, 127] but for NaN garbage).
  for (int j = 0; j < kSub; ++j) sc[j] = static_cast<int8_t>(std::min(127, nearest_even(iscale * scales[j])));
  // The quants again, against the scales as stored; a sub-block whose scale is 0 keeps its fit's.
  for (int j = 0; j < kSub; ++j) {
    const float d = f16_to_f32(dh) * sc[j];
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<uint8_t>(std::max(-32, std::min(31, nearest_even(x[16 * j + i] / d))) + 32);
  }
  // Each half of 128 elements: 64 bytes of ql (elements i and 64 + i share byte i, 32 + i and
  // 96 + i byte 32 + i: low nibble first) and 32 of qh (the high 2 bits of i, 32 + i, 64 + i,
  // 96 + i in bits 0-1, 2-3, 4-5, 6-7 of byte i).
  for (int c = 0; c < 2; ++c) {
    const uint8_t* l = L + 128 * c;
    uint8_t* ql = block + 64 * c;
    uint8_t* qh = block + kQ6KHighAt + 32 * c;
    for (int i = 0; i < 32; ++i) {
      ql[i] = static_cast<uint8_t>((l[i] & 15) | ((l[64 + i] & 15) << 4));
      ql[32 + i] = static_cast<uint8_t>((l[32 + i] & 15) | ((l[96 + i] & 15) << 4));
      qh[i] = static_cast<uint8_t>((l[i] >> 4) | ((l[32 + i] >> 4) << 2) | ((l[64 + i] >> 4) << 4) | ((l[96 + i] >> 4) << 6));
    }
  }
}

void dequantize_q6_k_block(const uint8_t* block, float* y) {
  uint16_t dh;
  std::memcpy(&dh, block + kQ6KDAt, 2);
  const float d = f16_to_f32(dh);
  const auto* sc = reinterpret_cast<const int8_t*>(block + kQ6KScalesAt);
  for (int e = 0; e < kQKBlock; ++e)
    y[e] = (d * static_cast<float>(sc[e / 16])) * static_cast<float>(q6_k_quant(block, e) - 32);
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
    case DType::kQ4_K: {
      ASTRAI_CHECK(n % kQKBlock == 0, "Q4_K: ", n, " elements are not whole blocks of ", kQKBlock);
      const auto* b = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; i += kQKBlock, b += kQ4KBlockBytes) dequantize_q4_k_block(b, dst + i);
      return;
    }
    case DType::kQ5_K: {
      ASTRAI_CHECK(n % kQKBlock == 0, "Q5_K: ", n, " elements are not whole blocks of ", kQKBlock);
      const auto* b = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; i += kQKBlock, b += kQ5KBlockBytes) dequantize_q5_k_block(b, dst + i);
      return;
    }
    case DType::kQ6_K: {
      ASTRAI_CHECK(n % kQKBlock == 0, "Q6_K: ", n, " elements are not whole blocks of ", kQKBlock);
      const auto* b = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; i += kQKBlock, b += kQ6KBlockBytes) dequantize_q6_k_block(b, dst + i);
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
    case DType::kQ4_K:
    case DType::kQ5_K: {
      ASTRAI_CHECK(n % kQKBlock == 0, dtype_name(dst_type), ": ", n, " elements are not whole blocks of ", kQKBlock);
      // The search costs ~100 ns per weight: blocks in parallel (each one's bytes depend on it alone).
      auto* b = static_cast<uint8_t*>(dst);
      const int64_t blocks = static_cast<int64_t>(n) / kQKBlock, bytes = block_bytes(dst_type);
      const bool q5 = dst_type == DType::kQ5_K;
#pragma omp parallel for schedule(static) if (blocks >= 64)
      for (int64_t i = 0; i < blocks; ++i) {
        if (q5) quantize_q5_k_block(src + i * kQKBlock, b + i * bytes);
        else quantize_q4_k_block(src + i * kQKBlock, b + i * bytes);
      }
      return;
    }
    case DType::kQ6_K: {
      ASTRAI_CHECK(n % kQKBlock == 0, "Q6_K: ", n, " elements are not whole blocks of ", kQKBlock);
      auto* b = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; i += kQKBlock, b += kQ6KBlockBytes) quantize_q6_k_block(src + i, b);
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
