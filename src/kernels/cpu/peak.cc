// The loops of the arithmetic peak probe (peak.h), one set per level: independent chains of one
// instruction in registers. The chains start apart, so the compiler cannot merge them. One f32
// loop serves every level over the level's vector type. The x86 and neon dot-product steps are
// inline asm on the chain's register: through the intrinsics GCC 12 copied accumulators between
// registers (and some to the stack) every iteration, and could hoist a product of loop-invariant
// inputs. They stay in their extension's namespace (vnni, bf16dot, sdot: scripts/check-isa.py),
// so neon's sdot loop and x86's VNNI loop are written apart. The reductions after the loops are
// unrolled so the chains stay in registers. The timing is in peak_probe.cc (compiled once).
#include <cstdint>

#if defined(ASTRAI_ISA_V4) || defined(ASTRAI_ISA_V3)
#include <immintrin.h>
#elif defined(ASTRAI_ISA_NEON)
#include <arm_neon.h>
#endif

#include <cmath>
#include <cstring>

#include "kernels/cpu/level_table.h"
#include "kernels/cpu/peak.h"

ASTRAI_KERNELS_BEGIN

namespace {

// ---- f32: a += x * y, fused, on the level's widest vector ----
#if defined(ASTRAI_ISA_V4)
using F32Vec = __m512;
constexpr int kF32Chains = 24;  // of 32 zmm: an FMA's latency times its ports, and room to spare
inline F32Vec f32_set(float v) { return _mm512_set1_ps(v); }
inline F32Vec f32_fma(F32Vec x, F32Vec y, F32Vec a) { return _mm512_fmadd_ps(x, y, a); }
constexpr const char* kF32Instruction = "vfmadd231ps zmm";
#elif defined(ASTRAI_ISA_V3)
using F32Vec = __m256;
constexpr int kF32Chains = 12;  // of 16 ymm, with the two operands
inline F32Vec f32_set(float v) { return _mm256_set1_ps(v); }
inline F32Vec f32_fma(F32Vec x, F32Vec y, F32Vec a) { return _mm256_fmadd_ps(x, y, a); }
constexpr const char* kF32Instruction = "vfmadd231ps ymm";
#elif defined(ASTRAI_ISA_NEON)
using F32Vec = float32x4_t;
constexpr int kF32Chains = 24;  // of 32 q registers
inline F32Vec f32_set(float v) { return vdupq_n_f32(v); }
inline F32Vec f32_fma(F32Vec x, F32Vec y, F32Vec a) { return vfmaq_f32(a, x, y); }  // fmla: in place
constexpr const char* kF32Instruction = "fmla v.4s";
#else  // generic: the reference's scalar std::fma
using F32Vec = float;
constexpr int kF32Chains = 8;
inline F32Vec f32_set(float v) { return v; }
inline F32Vec f32_fma(F32Vec x, F32Vec y, F32Vec a) { return std::fma(x, y, a); }
constexpr const char* kF32Instruction = "std::fma (scalar)";
#endif
constexpr int kF32Lanes = static_cast<int>(sizeof(F32Vec) / sizeof(float));

// The sum of v's lanes of type T (f32 or int32), in double.
template <typename T, typename V>
inline double lanes_sum(const V& v) {
  T l[sizeof(V) / sizeof(T)];
  std::memcpy(l, &v, sizeof v);
  double s = 0;
  for (T x : l) s += x;
  return s;
}

double f32_loop(int64_t iters, double* check) {
  F32Vec a[kF32Chains];
  const F32Vec x = f32_set(kPeakF32X), y = f32_set(kPeakF32Y);
#pragma GCC unroll 24
  for (int c = 0; c < kF32Chains; ++c) a[c] = f32_set(peak_f32_start(c));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int c = 0; c < kF32Chains; ++c) a[c] = f32_fma(x, y, a[c]);
  }
  double s = 0;
#pragma GCC unroll 24
  for (int c = 0; c < kF32Chains; ++c) s += lanes_sum<float>(a[c]);  // unrolled: a stays in registers
  *check += s;
  return 2.0 * static_cast<double>(iters) * kF32Chains * kF32Lanes;
}

#if defined(ASTRAI_ISA_V4) || defined(ASTRAI_ISA_V3)
// ---- 8-bit products without VNNI: AVX2's, which v4 runs too where the CPU has no VNNI ----
#if defined(ASTRAI_ISA_V4)
constexpr int kMaddChains = 12;
#else
constexpr int kMaddChains = 8;  // 8 accumulators, 3 operands and a temporary of 16 ymm
#endif

// AVX2's 8-bit product: u8 x s8 pairs to int16 (vpmaddubsw), pairs of those to int32
// (vpmaddwd by ones), added to the chain: 32 multiply-adds per three instructions.
double int8_madd_loop(int64_t iters, double* check) {
  __m256i acc[kMaddChains];
#pragma GCC unroll 12
  for (int c = 0; c < kMaddChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i u = _mm256_set1_epi8(1), s = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kMaddChains; ++c) {
      __m256i t;
      asm("vpmaddubsw %[s], %[u], %[t]\n\tvpmaddwd %[ones], %[t], %[t]\n\tvpaddd %[t], %[acc], %[acc]"
          : [acc] "+x"(acc[c]), [t] "=&x"(t)
          : [u] "x"(u), [s] "x"(s), [ones] "x"(ones));
    }
  }
  __m256i total = acc[0];  // int32 sums are exact in any order
#pragma GCC unroll 12
  for (int c = 1; c < kMaddChains; ++c) total = _mm256_add_epi32(total, acc[c]);
  *check += lanes_sum<int32_t>(total);
  return 2.0 * 32 * static_cast<double>(iters) * kMaddChains;
}

#elif !defined(ASTRAI_ISA_NEON)
// ---- generic: the reference's int32 multiply-adds ----
constexpr int kInt8Chains = 8;

// One 8-bit multiply-add per chain and iteration, in int32 as the reference sums a block; the
// empty asm (volatile: never hoisted) gives each chain a product of its own.
double int8_loop(int64_t iters, double* check) {
  int32_t acc[kInt8Chains];
  for (int c = 0; c < kInt8Chains; ++c) acc[c] = c;
  int32_t u = 1, s = 1;
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 8
    for (int c = 0; c < kInt8Chains; ++c) {
      asm volatile("" : "+r"(u), "+r"(s));
      acc[c] += u * s;
    }
  }
  double sum = 0;
  for (int32_t x : acc) sum += x;
  *check += sum;
  return 2.0 * static_cast<double>(iters) * kInt8Chains;
}

#endif

}  // namespace

#if defined(ASTRAI_ISA_V4) || defined(ASTRAI_ISA_V3)

// VNNI's 8-bit dot product, compiled for the level plus its extension (namespace vnni, as the
// kernels' VNNI tiles; scripts/check-isa.py allows the instruction nowhere else).
ASTRAI_PRAGMA(GCC push_options)
#if defined(ASTRAI_ISA_V4)
ASTRAI_PRAGMA(GCC target("avx512vnni"))
#else
ASTRAI_PRAGMA(GCC target("avxvnni"))
#endif
namespace vnni {
namespace {
#if defined(ASTRAI_ISA_V4)
using I32Vec = __m512i;
constexpr int kChains = 24;
constexpr const char* kInstruction = "vpdpbusd zmm";
inline I32Vec set_i32(int32_t v) { return _mm512_set1_epi32(v); }
inline I32Vec set_i8(int8_t v) { return _mm512_set1_epi8(v); }
inline I32Vec add_i32(I32Vec a, I32Vec b) { return _mm512_add_epi32(a, b); }
inline void dot_step(I32Vec& acc, I32Vec u, I32Vec s) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s)); }
#else
using I32Vec = __m256i;
constexpr int kChains = 12;
constexpr const char* kInstruction = "vpdpbusd ymm (AVX-VNNI)";
inline I32Vec set_i32(int32_t v) { return _mm256_set1_epi32(v); }
inline I32Vec set_i8(int8_t v) { return _mm256_set1_epi8(v); }
inline I32Vec add_i32(I32Vec a, I32Vec b) { return _mm256_add_epi32(a, b); }
inline void dot_step(I32Vec& acc, I32Vec u, I32Vec s) {
  asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
}
#endif
constexpr int kLanes = static_cast<int>(sizeof(I32Vec) / sizeof(int32_t));

double int8_vnni_loop(int64_t iters, double* check) {
  I32Vec acc[kChains];
#pragma GCC unroll 24
  for (int c = 0; c < kChains; ++c) acc[c] = set_i32(c);
  const I32Vec u = set_i8(1), s = set_i8(1);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int c = 0; c < kChains; ++c) dot_step(acc[c], u, s);
  }
  I32Vec total = acc[0];  // int32 sums are exact in any order
#pragma GCC unroll 24
  for (int c = 1; c < kChains; ++c) total = add_i32(total, acc[c]);
  *check += lanes_sum<int32_t>(total);
  return 2.0 * 4 * kLanes * static_cast<double>(iters) * kChains;
}
}  // namespace
}  // namespace vnni
ASTRAI_PRAGMA(GCC pop_options)

#if defined(ASTRAI_ISA_V4)
// bf16 pairs (1.0, 1.0) times (1.0, 1.0) into f32 lanes: 2 exact products and adds a lane (the
// chains stay below 2^24, so every sum is exact).
ASTRAI_PRAGMA(GCC push_options)
ASTRAI_PRAGMA(GCC target("avx512bf16"))
namespace bf16dot {  // the only functions holding VDPBF16PS (scripts/check-isa.py)
namespace {
constexpr int kChains = 16;  // 24 made GCC copy accumulators between registers
double bf16_dot_loop(int64_t iters, double* check) {
  __m512 acc[kChains];
#pragma GCC unroll 24
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512i one = _mm512_set1_epi16(0x3f80);  // bf16 1.0
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int c = 0; c < kChains; ++c) asm("vdpbf16ps %2, %1, %0" : "+v"(acc[c]) : "v"(one), "v"(one));
  }
  double sum = 0;
#pragma GCC unroll 24
  for (int c = 0; c < kChains; ++c) sum += lanes_sum<float>(acc[c]);  // unrolled: acc stays in registers
  *check += sum;
  return 2.0 * 32 * static_cast<double>(iters) * kChains;
}
}  // namespace
}  // namespace bf16dot
ASTRAI_PRAGMA(GCC pop_options)
#endif

PeakLoops level_loops() {
  PeakLoops p;
  p.f32 = {&f32_loop, kF32Instruction, kF32Chains, kF32Lanes, 0};
  p.int8 = {&int8_madd_loop, "vpmaddubsw + vpmaddwd + vpaddd ymm", kMaddChains, 8, 4};
  p.int8_vnni = {&vnni::int8_vnni_loop, vnni::kInstruction, vnni::kChains, vnni::kLanes, 4};
#if defined(ASTRAI_ISA_V4)
  p.bf16_dot = {&bf16dot::bf16_dot_loop, "vdpbf16ps zmm", bf16dot::kChains, 16, 2};
#endif
  return p;
}

#elif defined(ASTRAI_ISA_NEON)

ASTRAI_PRAGMA(GCC push_options)
ASTRAI_PRAGMA(GCC target("arch=armv8.2-a+dotprod"))
namespace sdot {
namespace {
constexpr int kChains = 24;
double int8_sdot_loop(int64_t iters, double* check) {
  int32x4_t acc[kChains];
#pragma GCC unroll 24
  for (int c = 0; c < kChains; ++c) acc[c] = vdupq_n_s32(c);
  const int8x16_t u = vdupq_n_s8(1), s = vdupq_n_s8(1);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int c = 0; c < kChains; ++c) asm("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc[c]) : "w"(u), "w"(s));
  }
  int32x4_t total = acc[0];  // int32 sums are exact in any order
#pragma GCC unroll 24
  for (int c = 1; c < kChains; ++c) total = vaddq_s32(total, acc[c]);
  *check += lanes_sum<int32_t>(total);
  return 2.0 * 16 * static_cast<double>(iters) * kChains;
}
}  // namespace
}  // namespace sdot
ASTRAI_PRAGMA(GCC pop_options)

PeakLoops level_loops() {
  PeakLoops p;
  p.f32 = {&f32_loop, kF32Instruction, kF32Chains, kF32Lanes, 0};
  p.int8_vnni = {&sdot::int8_sdot_loop, "sdot v.4s", sdot::kChains, 4, 4};  // none without it
  return p;
}

#else

PeakLoops level_loops() {
  PeakLoops p;
  p.f32 = {&f32_loop, kF32Instruction, kF32Chains, kF32Lanes, 0};
  p.int8 = {&int8_loop, "int32 multiply-add (scalar)", kInt8Chains, 1, 1};
  return p;
}

#endif

void fill_peak(KernelTable& t) { t.peak = level_loops(); }

ASTRAI_KERNELS_END
