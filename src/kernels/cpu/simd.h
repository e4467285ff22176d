// Vec16: 16 f32 lanes, the unit of the kernels' arithmetic contract, on every level:
//   v4: one zmm register; v3: two ymm (lanes 0-7, 8-15); neon: four q registers; generic: an
//   array. Each operation is defined per lane and rounds once, so a kernel written with these
//   gives the same bits on every level. Horizontal sums use one fixed tree (lane i + lane i+8,
//   then i + i+4, i + i+2, i + i+1), never a hardware horizontal add, whose order differs.
// The scalar overloads (float) have the same semantics, so one template serves both
// (exp_approx in vec_math.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(ASTRAI_ISA_V4) || defined(ASTRAI_ISA_V3)
#include <immintrin.h>
#elif defined(ASTRAI_ISA_NEON)
#include <arm_neon.h>
#endif

#include "kernels/cpu/level.h"
#include "tensor/dtype.h"

ASTRAI_KERNELS_BEGIN

constexpr int kLanes = 16;

// ---- Scalar operations, with the vector ones' semantics ----
inline float vfma(float a, float b, float c) { return std::fma(a, b, c); }    // a * b + c, one rounding
inline float vfnma(float a, float b, float c) { return std::fma(-a, b, c); }  // c - a * b, one rounding
inline float vmin(float a, float b) { return a < b ? a : b; }                 // x86 minps: b unless a < b
inline float vmax(float a, float b) { return a > b ? a : b; }                 // x86 maxps: b unless a > b
inline float vfloor(float a) { return std::floor(a); }
// 2^n for an integral n in [-126, 127], built in the exponent bits.
inline float vpow2i(float n) {
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// f16 bits to f32, exactly as the hardware conversions (F16C, AArch64 FCVT) do: a signalling
// NaN comes out quiet (its payload kept).
inline float f16_widen(uint16_t h) {
  float f = f16_to_f32(h);
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= 0x00400000u;
    std::memcpy(&f, &bits, sizeof f);
  }
  return f;
}

#if defined(ASTRAI_ISA_V4)

struct Vec16 {
  __m512 v;
  Vec16() = default;
  explicit Vec16(float x) : v(_mm512_set1_ps(x)) {}
  explicit Vec16(__m512 x) : v(x) {}
};

inline __mmask16 lane_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n < 0 ? 0 : n)) - 1);
}
inline Vec16 vzero() { return Vec16(_mm512_setzero_ps()); }
inline Vec16 vload(const float* p) { return Vec16(_mm512_loadu_ps(p)); }
inline Vec16 vload(const float* p, int64_t n) { return Vec16(_mm512_maskz_loadu_ps(lane_mask(n), p)); }
// Lanes [0, n) from p, the others from fill.
inline Vec16 vload_or(const float* p, int64_t n, Vec16 fill) { return Vec16(_mm512_mask_loadu_ps(fill.v, lane_mask(n), p)); }
inline Vec16 bf16_bits(__m256i h) { return Vec16(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))); }
inline Vec16 vload_bf16(const uint16_t* p) { return bf16_bits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline Vec16 vload_bf16(const uint16_t* p, int64_t n) { return bf16_bits(_mm256_maskz_loadu_epi16(lane_mask(n), p)); }
inline Vec16 vload_f16(const uint16_t* p) { return Vec16(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))); }
inline Vec16 vload_f16(const uint16_t* p, int64_t n) { return Vec16(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lane_mask(n), p))); }
// 16 int8 at q times the f16 scale bits dh: float(q) * float(d), exact (Q8_0 weights).
inline Vec16 vload_q8(const int8_t* q, uint16_t dh) {
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  return Vec16(_mm512_mul_ps(v, _mm512_set1_ps(_cvtsh_ss(dh))));
}
inline void vstore(float* p, Vec16 a) { _mm512_storeu_ps(p, a.v); }
inline void vstore(float* p, Vec16 a, int64_t n) { _mm512_mask_storeu_ps(p, lane_mask(n), a.v); }
inline Vec16 operator+(Vec16 a, Vec16 b) { return Vec16(_mm512_add_ps(a.v, b.v)); }
inline Vec16 operator-(Vec16 a, Vec16 b) { return Vec16(_mm512_sub_ps(a.v, b.v)); }
inline Vec16 operator*(Vec16 a, Vec16 b) { return Vec16(_mm512_mul_ps(a.v, b.v)); }
inline Vec16 operator/(Vec16 a, Vec16 b) { return Vec16(_mm512_div_ps(a.v, b.v)); }
inline Vec16 vfma(Vec16 a, Vec16 b, Vec16 c) { return Vec16(_mm512_fmadd_ps(a.v, b.v, c.v)); }
inline Vec16 vfnma(Vec16 a, Vec16 b, Vec16 c) { return Vec16(_mm512_fnmadd_ps(a.v, b.v, c.v)); }
inline Vec16 vmin(Vec16 a, Vec16 b) { return Vec16(_mm512_min_ps(a.v, b.v)); }
inline Vec16 vmax(Vec16 a, Vec16 b) { return Vec16(_mm512_max_ps(a.v, b.v)); }
inline Vec16 vfloor(Vec16 a) { return Vec16(_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)); }
inline Vec16 vpow2i(Vec16 n) {
  return Vec16(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127)), 23)));
}
inline Vec16 vkeep(Vec16 a, int64_t n) { return Vec16(_mm512_maskz_mov_ps(lane_mask(n), a.v)); }
// The tree on 8 lanes (after lane i + lane i+8).
inline float tree8(__m256 s) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // i + i+4
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));                                         // i + i+2
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));                                     // i + i+1
  return _mm_cvtss_f32(q);
}
inline float tree8_max(__m256 s) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}
inline float vsum(Vec16 a) { return tree8(_mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1))); }
inline float vmaxlanes(Vec16 a) {
  return tree8_max(_mm256_max_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1)));
}

// Parts: the registers a Vec16 is made of (one here).
constexpr int kParts = 1;
using Part = __m512;
inline Part& part(Vec16& a, int) { return a.v; }
inline Part pload(const float* p, int) { return _mm512_loadu_ps(p); }
inline Part pload_bf16(const uint16_t* p, int) { return vload_bf16(p).v; }
inline Part pload_f16(const uint16_t* p, int) { return vload_f16(p).v; }
// Part h of the 16 Q8_0 weights at quant offset `off` (0 or 16) of the 34-byte block at b.
inline Part pload_q8(const uint8_t* b, int64_t off, int) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  return vload_q8(reinterpret_cast<const int8_t*>(b + 2 + off), dh).v;
}
// The 16 Q4_0 weights of the 18-byte block at b: its low nibbles (off 0) or high ones (off 16).
inline Part pload_q4(const uint8_t* b, int64_t off, int) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
  const __m512i n = off ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, _mm512_set1_epi32(15));
  // n * d - 8 * d in one rounding: n * d and 8 * d are exact, and so is their difference, (n - 8) * d.
  const float d = _cvtsh_ss(dh);
  return _mm512_fmsub_ps(_mm512_cvtepi32_ps(n), _mm512_set1_ps(d), _mm512_set1_ps(8.0f * d));
}
// 16 Q4_K weights: the nibbles (q >> shift) & 15 of the 16 bytes at q, times d1 minus m1 (the
// sub-block's d * sc and dmin * m). One rounding: n * d1 is exact, so fused or not, the bits
// are those of the final subtraction.
inline Part pload_q4k(const uint8_t* q, int shift, float d1, float m1, int) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m512i n = _mm512_and_si512(_mm512_srl_epi32(b, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(15));
  return _mm512_fmsub_ps(_mm512_cvtepi32_ps(n), _mm512_set1_ps(d1), _mm512_set1_ps(m1));
}
// 16 bytes at q times d1 minus m1 (Q5_K's unpacked quants; one rounding, as pload_q4k).
inline Part pload_u8(const uint8_t* q, float d1, float m1, int) {
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  return _mm512_fmsub_ps(v, _mm512_set1_ps(d1), _mm512_set1_ps(m1));
}
// 16 int8 at q times d1: float(q) * d1 (Q6_K: q - 32 times d * scale, an exact product).
inline Part pload_i8(const int8_t* q, float d1, int) {
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  return _mm512_mul_ps(v, _mm512_set1_ps(d1));
}
inline float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
// out[l] = float(p[l]) * (l < 8 ? a : b) for the 16 bytes at p.
inline void widen_u8_scaled(const uint8_t* p, float a, float b, float* out) {
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  _mm512_storeu_ps(out, _mm512_mul_ps(v, _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1)));
}
inline Part pfma(Part a, Part b, Part c) { return _mm512_fmadd_ps(a, b, c); }
inline void ppin(Part& a) { asm("" : "+v"(a)); }

#elif defined(ASTRAI_ISA_V3)

struct Vec16 {
  __m256 lo, hi;  // lanes 0-7, 8-15
  Vec16() = default;
  explicit Vec16(float x) : lo(_mm256_set1_ps(x)), hi(_mm256_set1_ps(x)) {}
  Vec16(__m256 l, __m256 h) : lo(l), hi(h) {}
};

// Lanes [0, n) of 8 set (n clamped to [0, 8]), for maskload / maskstore.
inline __m256i lane_mask8(int64_t n) {
  const int32_t c = static_cast<int32_t>(n < 0 ? 0 : (n > 8 ? 8 : n));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m256 bf16x8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
inline __m128i load8x16(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline Vec16 vzero() { return Vec16(_mm256_setzero_ps(), _mm256_setzero_ps()); }
inline Vec16 vload(const float* p) { return Vec16(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
inline Vec16 vload(const float* p, int64_t n) {
  return Vec16(_mm256_maskload_ps(p, lane_mask8(n)), _mm256_maskload_ps(p + 8, lane_mask8(n - 8)));
}
inline Vec16 vload_or(const float* p, int64_t n, Vec16 fill) {
  const __m256i ml = lane_mask8(n), mh = lane_mask8(n - 8);
  return Vec16(_mm256_blendv_ps(fill.lo, _mm256_maskload_ps(p, ml), _mm256_castsi256_ps(ml)),
               _mm256_blendv_ps(fill.hi, _mm256_maskload_ps(p + 8, mh), _mm256_castsi256_ps(mh)));
}
inline Vec16 vload_bf16(const uint16_t* p) { return Vec16(bf16x8(load8x16(p)), bf16x8(load8x16(p + 8))); }
inline Vec16 vload_f16(const uint16_t* p) { return Vec16(_mm256_cvtph_ps(load8x16(p)), _mm256_cvtph_ps(load8x16(p + 8))); }
inline __m256 i8x8(const int8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}
inline Vec16 vload_q8(const int8_t* q, uint16_t dh) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
  return Vec16(_mm256_mul_ps(i8x8(q), d), _mm256_mul_ps(i8x8(q + 8), d));
}
// 16-bit tails have no masked load on AVX2: copied into a zeroed buffer (tails only).
inline size_t tail_bytes16(int64_t n) { return static_cast<size_t>(n < 0 ? 0 : (n < 16 ? n : 16)) * 2; }
inline Vec16 vload_bf16(const uint16_t* p, int64_t n) {
  alignas(32) uint16_t buf[16] = {};
  std::memcpy(buf, p, tail_bytes16(n));
  return vload_bf16(buf);
}
inline Vec16 vload_f16(const uint16_t* p, int64_t n) {
  alignas(32) uint16_t buf[16] = {};
  std::memcpy(buf, p, tail_bytes16(n));
  return vload_f16(buf);
}
inline void vstore(float* p, Vec16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline void vstore(float* p, Vec16 a, int64_t n) {
  _mm256_maskstore_ps(p, lane_mask8(n), a.lo);
  _mm256_maskstore_ps(p + 8, lane_mask8(n - 8), a.hi);
}
inline Vec16 operator+(Vec16 a, Vec16 b) { return Vec16(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
inline Vec16 operator-(Vec16 a, Vec16 b) { return Vec16(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
inline Vec16 operator*(Vec16 a, Vec16 b) { return Vec16(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
inline Vec16 operator/(Vec16 a, Vec16 b) { return Vec16(_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)); }
inline Vec16 vfma(Vec16 a, Vec16 b, Vec16 c) {
  return Vec16(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
inline Vec16 vfnma(Vec16 a, Vec16 b, Vec16 c) {
  return Vec16(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi));
}
inline Vec16 vmin(Vec16 a, Vec16 b) { return Vec16(_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)); }
inline Vec16 vmax(Vec16 a, Vec16 b) { return Vec16(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)); }
inline Vec16 vfloor(Vec16 a) { return Vec16(_mm256_floor_ps(a.lo), _mm256_floor_ps(a.hi)); }
inline __m256 pow2i8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline Vec16 vpow2i(Vec16 n) { return Vec16(pow2i8(n.lo), pow2i8(n.hi)); }
inline Vec16 vkeep(Vec16 a, int64_t n) {
  return Vec16(_mm256_and_ps(a.lo, _mm256_castsi256_ps(lane_mask8(n))),
               _mm256_and_ps(a.hi, _mm256_castsi256_ps(lane_mask8(n - 8))));
}
inline float tree8(__m256 s) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // i + i+4
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));                                         // i + i+2
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));                                     // i + i+1
  return _mm_cvtss_f32(q);
}
inline float tree8_max(__m256 s) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}
inline float vsum(Vec16 a) { return tree8(_mm256_add_ps(a.lo, a.hi)); }
inline float vmaxlanes(Vec16 a) { return tree8_max(_mm256_max_ps(a.lo, a.hi)); }

// Parts: the registers a Vec16 is made of (lanes 0-7 and 8-15). Tiles work a part at a time
// so only one part of each operand needs a register at once (16 ymm registers).
constexpr int kParts = 2;
using Part = __m256;
inline Part& part(Vec16& a, int h) { return h == 0 ? a.lo : a.hi; }
inline Part pload(const float* p, int h) { return _mm256_loadu_ps(p + 8 * h); }
inline Part pload_bf16(const uint16_t* p, int h) { return bf16x8(load8x16(p + 8 * h)); }
inline Part pload_f16(const uint16_t* p, int h) { return _mm256_cvtph_ps(load8x16(p + 8 * h)); }
inline Part pload_q8(const uint8_t* b, int64_t off, int h) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  return _mm256_mul_ps(i8x8(reinterpret_cast<const int8_t*>(b + 2 + off + 8 * h)), _mm256_set1_ps(_cvtsh_ss(dh)));
}
inline Part pload_q4(const uint8_t* b, int64_t off, int h) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * h)));
  const __m256i n = off ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, _mm256_set1_epi32(15));
  // n * d - 8 * d in one rounding: n * d and 8 * d are exact, and so is their difference, (n - 8) * d.
  const float d = _cvtsh_ss(dh);
  return _mm256_fmsub_ps(_mm256_cvtepi32_ps(n), _mm256_set1_ps(d), _mm256_set1_ps(8.0f * d));
}
inline Part pload_q4k(const uint8_t* q, int shift, float d1, float m1, int h) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * h)));
  const __m256i n = _mm256_and_si256(_mm256_srl_epi32(b, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(15));
  return _mm256_fmsub_ps(_mm256_cvtepi32_ps(n), _mm256_set1_ps(d1), _mm256_set1_ps(m1));
}
inline Part pload_i8(const int8_t* q, float d1, int h) { return _mm256_mul_ps(i8x8(q + 8 * h), _mm256_set1_ps(d1)); }
inline float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
inline __m256 u8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline Part pload_u8(const uint8_t* q, float d1, float m1, int h) {
  return _mm256_fmsub_ps(u8x8(q + 8 * h), _mm256_set1_ps(d1), _mm256_set1_ps(m1));
}
inline void widen_u8_scaled(const uint8_t* p, float a, float b, float* out) {
  _mm256_storeu_ps(out, _mm256_mul_ps(u8x8(p), _mm256_set1_ps(a)));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(u8x8(p + 8), _mm256_set1_ps(b)));
}
inline Part pfma(Part a, Part b, Part c) { return _mm256_fmadd_ps(a, b, c); }
inline void ppin(Part& a) { asm("" : "+x"(a)); }

#elif defined(ASTRAI_ISA_NEON)

struct Vec16 {
  float32x4_t q[4];  // lanes 0-3, 4-7, 8-11, 12-15
  Vec16() = default;
  explicit Vec16(float x) : q{vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x)} {}
};

template <typename F>
inline Vec16 map4(F&& f) {
  Vec16 r;
  for (int i = 0; i < 4; ++i) r.q[i] = f(i);
  return r;
}
inline Vec16 vzero() { return Vec16(0.0f); }
inline Vec16 vload(const float* p) { return map4([&](int i) { return vld1q_f32(p + 4 * i); }); }
inline Vec16 vload_bf16(const uint16_t* p) {
  return map4([&](int i) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * i), 16)); });
}
inline Vec16 vload_f16(const uint16_t* p) {
  return map4([&](int i) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i))); });
}
inline Vec16 vload_q8(const int8_t* q, uint16_t dh) {
  const float d = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(dh))), 0);
  const int16x8_t lo = vmovl_s8(vld1_s8(q)), hi = vmovl_s8(vld1_s8(q + 8));
  const int16x4_t h[4] = {vget_low_s16(lo), vget_high_s16(lo), vget_low_s16(hi), vget_high_s16(hi)};
  return map4([&](int i) { return vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(h[i])), d); });
}
// Tails through a zeroed buffer (no masked loads on NEON).
inline Vec16 vload(const float* p, int64_t n) {
  float buf[16] = {};
  std::memcpy(buf, p, static_cast<size_t>(n < 0 ? 0 : (n < 16 ? n : 16)) * 4);
  return vload(buf);
}
inline Vec16 vload_bf16(const uint16_t* p, int64_t n) {
  uint16_t buf[16] = {};
  std::memcpy(buf, p, static_cast<size_t>(n < 0 ? 0 : (n < 16 ? n : 16)) * 2);
  return vload_bf16(buf);
}
inline Vec16 vload_f16(const uint16_t* p, int64_t n) {
  uint16_t buf[16] = {};
  std::memcpy(buf, p, static_cast<size_t>(n < 0 ? 0 : (n < 16 ? n : 16)) * 2);
  return vload_f16(buf);
}
inline void vstore(float* p, Vec16 a) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.q[i]);
}
inline void vstore(float* p, Vec16 a, int64_t n) {
  float buf[16];
  vstore(buf, a);
  std::memcpy(p, buf, static_cast<size_t>(n < 0 ? 0 : (n < 16 ? n : 16)) * 4);
}
inline Vec16 vload_or(const float* p, int64_t n, Vec16 fill) {
  float buf[16];
  vstore(buf, fill);
  std::memcpy(buf, p, static_cast<size_t>(n < 0 ? 0 : (n < 16 ? n : 16)) * 4);
  return vload(buf);
}
inline Vec16 operator+(Vec16 a, Vec16 b) { return map4([&](int i) { return vaddq_f32(a.q[i], b.q[i]); }); }
inline Vec16 operator-(Vec16 a, Vec16 b) { return map4([&](int i) { return vsubq_f32(a.q[i], b.q[i]); }); }
inline Vec16 operator*(Vec16 a, Vec16 b) { return map4([&](int i) { return vmulq_f32(a.q[i], b.q[i]); }); }
inline Vec16 operator/(Vec16 a, Vec16 b) { return map4([&](int i) { return vdivq_f32(a.q[i], b.q[i]); }); }
inline Vec16 vfma(Vec16 a, Vec16 b, Vec16 c) { return map4([&](int i) { return vfmaq_f32(c.q[i], a.q[i], b.q[i]); }); }
inline Vec16 vfnma(Vec16 a, Vec16 b, Vec16 c) { return map4([&](int i) { return vfmsq_f32(c.q[i], a.q[i], b.q[i]); }); }
// x86 semantics (b unless a < b / a > b), not FMIN/FMAX, which return NaN for a NaN operand.
inline Vec16 vmin(Vec16 a, Vec16 b) { return map4([&](int i) { return vbslq_f32(vcltq_f32(a.q[i], b.q[i]), a.q[i], b.q[i]); }); }
inline Vec16 vmax(Vec16 a, Vec16 b) { return map4([&](int i) { return vbslq_f32(vcgtq_f32(a.q[i], b.q[i]), a.q[i], b.q[i]); }); }
inline Vec16 vfloor(Vec16 a) { return map4([&](int i) { return vrndmq_f32(a.q[i]); }); }
inline Vec16 vpow2i(Vec16 n) {
  return map4([&](int i) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23));
  });
}
inline Vec16 vkeep(Vec16 a, int64_t n) {
  const int32x4_t idx = {0, 1, 2, 3};
  return map4([&](int i) {
    const uint32x4_t keep = vcltq_s32(vaddq_s32(idx, vdupq_n_s32(4 * i)), vdupq_n_s32(static_cast<int32_t>(n < 16 ? n : 16)));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a.q[i]), keep));
  });
}
// The tree with 4 x 4 lanes: (q0 + q2) + (q1 + q3) is lane i + i+8, then + i+4; then the
// halves (i + i+2), then lanes 0 + 1. No vaddvq (its order differs).
inline float vsum(Vec16 a) {
  const float32x4_t s = vaddq_f32(vaddq_f32(a.q[0], a.q[2]), vaddq_f32(a.q[1], a.q[3]));
  const float32x2_t h = vadd_f32(vget_low_f32(s), vget_high_f32(s));
  return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}
inline float32x4_t max4(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
inline float vmaxlanes(Vec16 a) {
  const float32x4_t s = max4(max4(a.q[0], a.q[2]), max4(a.q[1], a.q[3]));
  const float32x2_t lo = vget_low_f32(s), hi = vget_high_f32(s);
  const float32x2_t h = vbsl_f32(vcgt_f32(lo, hi), lo, hi);
  return vmax(vget_lane_f32(h, 0), vget_lane_f32(h, 1));
}

// Parts: the registers a Vec16 is made of (lanes 4h to 4h + 3).
constexpr int kParts = 4;
using Part = float32x4_t;
inline Part& part(Vec16& a, int h) { return a.q[h]; }
inline Part pload(const float* p, int h) { return vld1q_f32(p + 4 * h); }
inline Part pload_bf16(const uint16_t* p, int h) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * h), 16)); }
inline Part pload_f16(const uint16_t* p, int h) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * h))); }
inline Part pload_q8(const uint8_t* b, int64_t off, int h) {
  uint16_t dh;
  int32_t q4;
  std::memcpy(&dh, b, 2);
  std::memcpy(&q4, b + 2 + off + 4 * h, 4);  // 4 quants; no load past the block's end
  const float d = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(dh))), 0);
  const int16x8_t q = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(q4)));
  return vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), d);
}
inline Part pload_q4(const uint8_t* b, int64_t off, int h) {
  uint16_t dh;
  uint32_t q4;
  std::memcpy(&dh, b, 2);
  std::memcpy(&q4, b + 2 + 4 * h, 4);
  const float d = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(dh))), 0);
  const uint32x4_t q = vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(q4)))));
  const uint32x4_t n = off ? vshrq_n_u32(q, 4) : vandq_u32(q, vdupq_n_u32(15));
  return vmulq_n_f32(vcvtq_f32_s32(vsubq_s32(vreinterpretq_s32_u32(n), vdupq_n_s32(8))), d);
}
// -m1 + n * d1 in one rounding: the same bits as n * d1 - m1 (the product is exact).
inline Part pload_q4k(const uint8_t* q, int shift, float d1, float m1, int h) {
  uint32_t q4;
  std::memcpy(&q4, q + 4 * h, 4);
  const uint32x4_t b = vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(q4)))));
  const uint32x4_t n = vandq_u32(vshlq_u32(b, vdupq_n_s32(-shift)), vdupq_n_u32(15));
  return vfmaq_f32(vdupq_n_f32(-m1), vcvtq_f32_u32(n), vdupq_n_f32(d1));
}
inline Part pload_u8(const uint8_t* q, float d1, float m1, int h) {
  uint32_t q4;
  std::memcpy(&q4, q + 4 * h, 4);
  const uint32x4_t n = vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(q4)))));
  return vfmaq_f32(vdupq_n_f32(-m1), vcvtq_f32_u32(n), vdupq_n_f32(d1));
}
inline Part pload_i8(const int8_t* q, float d1, int h) {
  int32_t q4;
  std::memcpy(&q4, q + 4 * h, 4);
  const int16x8_t w = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(q4)));
  return vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), d1);
}
inline float f16_scalar(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
inline void widen_u8_scaled(const uint8_t* p, float a, float b, float* out) {
  const uint8x16_t v = vld1q_u8(p);
  const uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_u8(vget_high_u8(v));
  vst1q_f32(out, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), a));
  vst1q_f32(out + 4, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))), a));
  vst1q_f32(out + 8, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), b));
  vst1q_f32(out + 12, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi))), b));
}
inline Part pfma(Part a, Part b, Part c) { return vfmaq_f32(c, a, b); }
inline void ppin(Part& a) { asm("" : "+w"(a)); }

#else  // generic: portable C++

struct Vec16 {
  float v[16];
  Vec16() = default;
  explicit Vec16(float x) {
    for (float& l : v) l = x;
  }
};

template <typename F>
inline Vec16 map16(F&& f) {
  Vec16 r;
  for (int l = 0; l < 16; ++l) r.v[l] = f(l);
  return r;
}
inline int64_t clamp16(int64_t n) { return n < 0 ? 0 : (n < 16 ? n : 16); }
inline Vec16 vzero() { return Vec16(0.0f); }
inline Vec16 vload(const float* p) { return map16([&](int l) { return p[l]; }); }
inline Vec16 vload(const float* p, int64_t n) { return map16([&](int l) { return l < n ? p[l] : 0.0f; }); }
inline Vec16 vload_or(const float* p, int64_t n, Vec16 fill) { return map16([&](int l) { return l < n ? p[l] : fill.v[l]; }); }
inline Vec16 vload_bf16(const uint16_t* p) { return map16([&](int l) { return bf16_to_f32(p[l]); }); }
inline Vec16 vload_bf16(const uint16_t* p, int64_t n) {
  return map16([&](int l) { return l < n ? bf16_to_f32(p[l]) : 0.0f; });
}
inline Vec16 vload_f16(const uint16_t* p) { return map16([&](int l) { return f16_widen(p[l]); }); }
inline Vec16 vload_f16(const uint16_t* p, int64_t n) { return map16([&](int l) { return l < n ? f16_widen(p[l]) : 0.0f; }); }
inline Vec16 vload_q8(const int8_t* q, uint16_t dh) {
  const float d = f16_widen(dh);
  return map16([&](int l) { return static_cast<float>(q[l]) * d; });
}
inline void vstore(float* p, Vec16 a) { std::memcpy(p, a.v, sizeof a.v); }
inline void vstore(float* p, Vec16 a, int64_t n) { std::memcpy(p, a.v, static_cast<size_t>(clamp16(n)) * 4); }
inline Vec16 operator+(Vec16 a, Vec16 b) { return map16([&](int l) { return a.v[l] + b.v[l]; }); }
inline Vec16 operator-(Vec16 a, Vec16 b) { return map16([&](int l) { return a.v[l] - b.v[l]; }); }
inline Vec16 operator*(Vec16 a, Vec16 b) { return map16([&](int l) { return a.v[l] * b.v[l]; }); }
inline Vec16 operator/(Vec16 a, Vec16 b) { return map16([&](int l) { return a.v[l] / b.v[l]; }); }
inline Vec16 vfma(Vec16 a, Vec16 b, Vec16 c) { return map16([&](int l) { return vfma(a.v[l], b.v[l], c.v[l]); }); }
inline Vec16 vfnma(Vec16 a, Vec16 b, Vec16 c) { return map16([&](int l) { return vfnma(a.v[l], b.v[l], c.v[l]); }); }
inline Vec16 vmin(Vec16 a, Vec16 b) { return map16([&](int l) { return vmin(a.v[l], b.v[l]); }); }
inline Vec16 vmax(Vec16 a, Vec16 b) { return map16([&](int l) { return vmax(a.v[l], b.v[l]); }); }
inline Vec16 vfloor(Vec16 a) { return map16([&](int l) { return vfloor(a.v[l]); }); }
inline Vec16 vpow2i(Vec16 n) { return map16([&](int l) { return vpow2i(n.v[l]); }); }
inline Vec16 vkeep(Vec16 a, int64_t n) { return map16([&](int l) { return l < n ? a.v[l] : 0.0f; }); }
inline float vsum(Vec16 a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) a.v[l] = a.v[l] + a.v[l + w];
  return a.v[0];
}
inline float vmaxlanes(Vec16 a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) a.v[l] = vmax(a.v[l], a.v[l + w]);
  return a.v[0];
}

// Parts: the whole Vec16.
constexpr int kParts = 1;
using Part = Vec16;
inline Part& part(Vec16& a, int) { return a; }
inline Part pload(const float* p, int) { return vload(p); }
inline Part pload_bf16(const uint16_t* p, int) { return vload_bf16(p); }
inline Part pload_f16(const uint16_t* p, int) { return vload_f16(p); }
inline Part pload_q8(const uint8_t* b, int64_t off, int) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  return vload_q8(reinterpret_cast<const int8_t*>(b + 2 + off), dh);
}
inline Part pload_q4(const uint8_t* b, int64_t off, int) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  const float d = f16_widen(dh);
  return map16([&](int l) { return static_cast<float>((off ? b[2 + l] >> 4 : b[2 + l] & 15) - 8) * d; });
}
inline Part pload_q4k(const uint8_t* q, int shift, float d1, float m1, int) {
  return map16([&](int l) { return static_cast<float>((q[l] >> shift) & 15) * d1 - m1; });
}
inline Part pload_u8(const uint8_t* q, float d1, float m1, int) {
  return map16([&](int l) { return static_cast<float>(q[l]) * d1 - m1; });
}
inline Part pload_i8(const int8_t* q, float d1, int) { return map16([&](int l) { return static_cast<float>(q[l]) * d1; }); }
inline float f16_scalar(uint16_t h) { return f16_widen(h); }
inline void widen_u8_scaled(const uint8_t* p, float a, float b, float* out) {
  for (int l = 0; l < 16; ++l) out[l] = static_cast<float>(p[l]) * (l < 8 ? a : b);
}
inline Part pfma(Part a, Part b, Part c) { return vfma(a, b, c); }
inline void ppin(Part&) {}

#endif

// Keeps a value in registers: GCC otherwise folds a weight vector into every FMA that uses it,
// loading it once per use instead of once.
inline void pin(Vec16& a) {
#if defined(ASTRAI_ISA_V4)
  asm("" : "+v"(a.v));
#elif defined(ASTRAI_ISA_V3)
  asm("" : "+x"(a.lo), "+x"(a.hi));
#elif defined(ASTRAI_ISA_NEON)
  asm("" : "+w"(a.q[0]), "+w"(a.q[1]), "+w"(a.q[2]), "+w"(a.q[3]));
#else
  (void)a;
#endif
}

// Requests the cache line at p into L2. An asm statement on x86, not __builtin_prefetch: GCC
// treats the builtin as free of side effects, so a helper that only prefetches is found pure
// and its calls are deleted.
inline void prefetch_l2(const void* p) {
#if defined(ASTRAI_ISA_V4) || defined(ASTRAI_ISA_V3)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#elif defined(ASTRAI_ISA_NEON)
  asm volatile("prfm pldl2keep, %0" : : "Q"(*static_cast<const char*>(p)));
#else
  (void)p;
#endif
}

#if defined(ASTRAI_ISA_V4) || defined(ASTRAI_ISA_V3)
// The 8 x 8 dwords of v[0..8) transposed: out[s] dword n = v[n] dword s (ymm, on v3 and v4:
// linear_int8's interleaved steps, attention's transposed K).
inline void transpose8x8_epi32(const __m256i* v, __m256i* out) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      u[i + h] = _mm256_unpacklo_epi64(t[i + h], t[i + 2 + h]);
      u[i + 2 + h] = _mm256_unpackhi_epi64(t[i + h], t[i + 2 + h]);
    }
  // u[0]: dwords 0 of v0..v3 | dwords 4; u[2]: dwords 1; u[1]: dwords 2; u[3]: dwords 3 (same for u[4..7]).
  const int order[4] = {0, 2, 1, 3};
  for (int q = 0; q < 4; ++q) {
    out[q] = _mm256_permute2x128_si256(u[order[q]], u[4 + order[q]], 0x20);
    out[4 + q] = _mm256_permute2x128_si256(u[order[q]], u[4 + order[q]], 0x31);
  }
}
#endif

// Loads and stores of up to 16 lanes at p: whole when n >= 16, else the first n (tails).
inline Vec16 vload_n(const float* p, int64_t n) { return n >= kLanes ? vload(p) : vload(p, n); }
inline void vstore_n(float* p, Vec16 a, int64_t n) {
  if (n >= kLanes) vstore(p, a);
  else vstore(p, a, n);
}

// Elements of a weight or K/V row as Vec16 by element type (f32, bf16 as uint16_t).
inline Vec16 vload_elem(const float* p) { return vload(p); }
inline Vec16 vload_elem(const float* p, int64_t n) { return vload(p, n); }
inline Vec16 vload_elem(const uint16_t* p) { return vload_bf16(p); }
inline Vec16 vload_elem(const uint16_t* p, int64_t n) { return vload_bf16(p, n); }
template <typename E>
inline Vec16 vload_elem_n(const E* p, int64_t n) {
  return n >= kLanes ? vload_elem(p) : vload_elem(p, n);
}

ASTRAI_KERNELS_END
