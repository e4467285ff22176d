// kernels::linear_int8 — quantized weights times 8-bit activations (definition in linear_int8.h).
//
// Each call quantizes the rows of x once (all threads), then splits the outputs over the threads
// in groups of 8. The generic level computes one output at a time, as the definition is written;
// neon too, with each block's integer sums in vectors (sdot where the CPU has it). x86 levels (v3 and v4 share the AVX2 code) work on tiles of up to 4 rows
// of x times 8 outputs: per weight block, 32 products per `maddubs` (Q8_0 through the sign trick,
// the nibble formats directly as unsigned bytes), pairs summed by `madd` (times the sub-block
// scale for the k-quants), and the 8 outputs' sums reduced together by `hadd` into one vector
// whose lanes are the outputs, so the f32 chain of every output runs in its own lane. With more
// rows than one tile, Q4_0, Q4_K, Q5_K and Q6_K groups are first interleaved by output in cache (see
// "Many rows" below), which needs no reduction at all; where the CPU has VNNI, every format, Q8_0
// too, takes that route with vpdpbusd (see "VNNI"; zmm on v4, by up to three groups of 8 outputs
// at once but for Q6_K: groups_at_once). The tiles of up to 4 rows
// (linear_int8_tiles.inc) run with VNNI too: on v3 the k-quants' (AVX-VNNI), on v4 zmm tiles of
// their own for Q4_0, Q4_K, Q5_K and Q6_K (tile_q4_0_in_place, tile_q4k_in_place,
// tile_q6k_in_place).
#include "kernels/cpu/linear_int8.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/gemm_mode.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_tile.h"
#include "kernels/cpu/simd.h"

ASTRAI_KERNELS_BEGIN

namespace {

constexpr float kTinyAmax = 1e-30f;  // blocks below this are all zero (127 / amax would overflow)

// Rows of x quantized: q[row * k + e], d[row * k / block + b], sums of q per 16 and per 32;
// vnni: many-row tiles use VNNI (x86); qu: q + 128 as unsigned bytes (Q8_0's VNNI route, else null).
struct ActRows {
  const int8_t* q;
  bool vnni;
  const uint8_t* qu;
  const float* d;
  const int16_t* s16;
  const int16_t* s32;
  int64_t k;
  int64_t block;
};

// The largest |x[e]| of a block and whether every x[e] is finite (the largest is only used then).
#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
// 8 lanes at a time (blocks are 32 or 256 values); max is exact, so the same value as one by one.
inline float abs_max(const float* x, int64_t n, bool* finite) {
  const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
  __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int64_t e = 0; e < n; e += 8) {
    const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + e));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));  // !(a <= FLT_MAX): inf or NaN
    m = _mm256_max_ps(m, a);
  }
  *finite = _mm256_movemask_ps(bad) == 0;
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
#else
inline float abs_max(const float* x, int64_t n, bool* finite) {
  float amax = 0.0f;
  *finite = true;
  for (int64_t e = 0; e < n; ++e) {
    const float a = std::fabs(x[e]);
    if (!(a <= FLT_MAX)) *finite = false;
    else if (a > amax) amax = a;
  }
  return amax;
}
#endif

void quantize_block(const float* x, int64_t n, int8_t* q, float* d) {
  bool finite = true;
  const float amax = abs_max(x, n, &finite);
  if (!finite || amax < kTinyAmax) {
    *d = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    std::memset(q, 0, static_cast<size_t>(n));
    return;
  }
  const float inv = 127.0f / amax;
  *d = amax / 127.0f;
  for (int64_t e = 0; e < n; ++e) {
    const float v = std::nearbyint(x[e] * inv);
    q[e] = static_cast<int8_t>(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
  }
}

void quantize_row(const float* x, int64_t k, int64_t block, int8_t* q, float* d, int16_t* s16, int16_t* s32) {
  for (int64_t b = 0; b < k / block; ++b) quantize_block(x + b * block, block, q + b * block, d + b);
  for (int64_t g = 0; g < k / 16; ++g) {
    int s = 0;
    for (int e = 0; e < 16; ++e) s += q[g * 16 + e];
    s16[g] = static_cast<int16_t>(s);
  }
  for (int64_t g = 0; g < k / 32; ++g) s32[g] = static_cast<int16_t>(s16[2 * g] + s16[2 * g + 1]);
}

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_widen(h);
}

// ---- The definition, one output at a time (generic, neon, and x86's partial groups) ----
#if defined(ASTRAI_ISA_NEON)
// neon: with widening multiplies, and with ARMv8.2's dot product (sdot) for CPUs that have it
// (use_vnni below; the same exact integer sums, so the same bits).
namespace widen {
#include "kernels/cpu/linear_int8_ref.inc"
}  // namespace widen
ASTRAI_PRAGMA(GCC push_options)
ASTRAI_PRAGMA(GCC target("arch=armv8.2-a+dotprod"))
namespace sdot {
#define ASTRAI_NEON_SDOT 1
#include "kernels/cpu/linear_int8_ref.inc"
#undef ASTRAI_NEON_SDOT
}  // namespace sdot
ASTRAI_PRAGMA(GCC pop_options)
#else
#include "kernels/cpu/linear_int8_ref.inc"
#endif

constexpr int kTileRows = 4;  // rows of x per x86 tile; more go through interleaved steps
// With VNNI, Q8_0 takes the interleaved steps past this many rows (v4: from 4 rows, 1.5x the 4-row
// tile; 3 rows measured level).
#if defined(ASTRAI_ISA_V4)
constexpr int64_t kQ8StepsFrom = 3;
#else
constexpr int64_t kQ8StepsFrom = kTileRows;
#endif
// v4's VNNI steps (Pairs) hold Q4_0 as Q8_0's: signed values q - 8 and 128 * their sum per
// output, against the activations as unsigned bytes, so that the block's offset is the same for
// every row of x (8 * sum q_x per row took 15% of a 32-row product).
#if defined(ASTRAI_ISA_V4)
constexpr bool kSignedQ4Steps = true;
#else
constexpr bool kSignedQ4Steps = false;
#endif
// Whether T's VNNI steps hold signed weights (and take x as unsigned bytes, ActRows::qu).
constexpr bool signed_steps(DType t) { return t == DType::kQ8_0 || (t == DType::kQ4_0 && kSignedQ4Steps); }
// Rows of x past which the VNNI tiles take the interleaved steps (outputs: why these counts).
constexpr int64_t vnni_steps_from(DType t) { return t == DType::kQ8_0 ? kQ8StepsFrom : kTileRows; }

// How many whole groups of one matrix run_group may hand outputs<T> at once (8 W rows each): v4's
// VNNI steps of Q8_0, Q4_0, Q4_K and Q5_K take up to three (tiles of 4 rows by 24 outputs, each
// activation broadcast feeding three vpdpbusd). gemm_bench's quantized table (Zen 5, 32 and 512
// rows, alternating rounds): two groups against one 1.07-1.21x (one thread), three against two
// 1.02-1.08x at best and 1.00-1.06x in the median (two threads), four against three 0.76-1.05x;
// Q6_K (a scale per 16 weights, so a multiply per two vpdpbusd) two against one 0.94-1.00x, so it
// keeps one.
constexpr int64_t kMaxGroupsAtOnce = 3;
constexpr bool groups_together(DType t) { return t != DType::kQ6_K; }
inline int64_t groups_at_once([[maybe_unused]] DType t, [[maybe_unused]] int64_t rows, [[maybe_unused]] bool vnni) {
#if defined(ASTRAI_ISA_V4)
  return vnni && groups_together(t) && rows > vnni_steps_from(t) ? kMaxGroupsAtOnce : 1;
#else
  return 1;
#endif
}

#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
// The 4 bytes at p in every dword.
inline __m256i broadcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Lane n of the result = the sum of the 8 lanes of h..., given h01 = hadd(p0, p1), h23, h45, h67.
inline __m256i reduce_outputs(__m256i h01, __m256i h23, __m256i h45, __m256i h67) {
  const __m256i a = _mm256_hadd_epi32(h01, h23);  // [p0..p3 lanes 0-3 | p0..p3 lanes 4-7]
  const __m256i b = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}
inline __m256i reduce_outputs(const __m256i* p) {
  return reduce_outputs(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]), _mm256_hadd_epi32(p[4], p[5]),
                        _mm256_hadd_epi32(p[6], p[7]));
}

// The f16 values at p, p + stride, ..., p + 7 stride as f32.
inline __m256 f16x8(const uint8_t* p, int64_t stride) {
  alignas(16) uint16_t h[8];
  for (int n = 0; n < 8; ++n) std::memcpy(&h[n], p + n * stride, 2);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

// The 6-bit scales and mins of a Q4_K or Q5_K block: bytes 0-7 sc[0..7], 8-15 m[0..7], the words
// of q4k_six_bit formed in a register from one 16-byte load (the 12 scale bytes and 4 of the
// quants, unused). Built from the scalar words instead (four inserts), the in-place decode tile
// ran 20-25% slower.
inline __m128i q4k_scales_mins(const uint8_t* b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQ4KScalesAt));  // w0 w1 w2 (+ 4 quant bytes)
  const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));                     // w0 w2 w1 w2
  const __m128i hi = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                                   _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));    // w0 w0 w1 w1 >> 2
  return _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)),
                      hi);
}

inline void store_outputs(__m256 acc, const float* bias, float* y) {
  _mm256_storeu_ps(y, bias ? _mm256_add_ps(acc, _mm256_loadu_ps(bias)) : acc);
}

// One block's step of the definition (dot_ref in linear_int8_ref.inc) for 8 outputs: acc +
// (d_w * d_x) * float(s), one fused multiply-add. Every x86 tile ends its blocks through these.
inline __m256 add_block(__m256 acc, __m256 dw, float dx, __m256i s) {
  return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(s), acc);
}
// Q4_K / Q5_K: + d * d_x * sa, then - dmin * d_x * sb.
inline __m256 add_k_block(__m256 acc, __m256 d, __m256 dmin, float dx, __m256i sa, __m256i sb) {
  acc = add_block(acc, d, dx, sa);
  return _mm256_fmadd_ps(_mm256_mul_ps(dmin, _mm256_set1_ps(dx)),
                         _mm256_xor_ps(_mm256_cvtepi32_ps(sb), _mm256_set1_ps(-0.0f)), acc);
}

// The next group's share for block b of this one (pf: its first byte, or null): the 8 rows
// that follow are contiguous, so the block's 1 / nb of them.
inline void prefetch_share(const uint8_t* pf, int64_t b, int64_t bytes_per_block) {
  if (!pf) return;
  for (int64_t off = b * bytes_per_block; off < (b + 1) * bytes_per_block; off += 64) prefetch_l2(pf + off);
}

// Each dword (s, s) as two int16 from 8 int32 scales (for madd by a scale per sub-block).
inline __m256i pair_words(__m256i s32) {
  return _mm256_or_si256(_mm256_and_si256(s32, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(s32, 16));
}

// Q4_K / Q5_K: the 64 quants of sub-blocks 2c and 2c + 1 at blk: nibbles of qs's 32 bytes c,
// Q5_K's fifth bits (bits 2c, 2c + 1 of qh) added in.
template <DType T>
inline void k_quants(const uint8_t* blk, int c, __m256i* lo, __m256i* hi) {
  const __m256i low4 = _mm256_set1_epi8(15);
  if constexpr (T == DType::kQ4_K) {
    const __m256i v = load256(blk + kQ4KQuantsAt + 32 * c);
    *lo = _mm256_and_si256(v, low4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  } else {
    const __m256i v = load256(blk + kQ5KQuantsAt + 32 * c), qh = load256(blk + kQ5KHighAt), one = _mm256_set1_epi8(1);
    const __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
    const __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
    *lo = _mm256_or_si256(_mm256_and_si256(v, low4), _mm256_slli_epi16(b0, 4));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), _mm256_slli_epi16(b1, 4));
  }
}

// The few-row tiles with maddubs (linear_int8_tiles.inc): pairs of products in int16, widened and
// summed by madd (by ones, or by each dword's scale as an (s, s) int16 pair).
inline __m256i dot4(__m256i u, __m256i s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)); }
inline __m256i scale_words(__m256i s32) { return pair_words(s32); }
inline __m256i add_scaled(__m256i acc, __m256i u, __m256i s, __m256i sc) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc));
}
#include "kernels/cpu/linear_int8_tiles.inc"

// ---- Many rows (prefill): the group's weights interleaved by output, once per row block ----
//
// Row tiles that pass over one group of 8 W rows re-read its blocks; for many of them the group
// is first rewritten, in a buffer that stays in L1/L2, as 8 steps of 32 bytes per block of 32
// weights: step s holds weights 4s..4s+3 of output 0, then of output 1, ... of output 7. One
// `maddubs` of a step against 4 activation bytes broadcast to every dword then yields, in int16
// lanes 2n and 2n+1, output n's products: the sums land in the output's own lane, with no
// horizontal reduction. Nibble products (at most 15 * 127 per byte pair) add up over a whole
// block of 32 in int16 (16 * 15 * 127 = 30480 < 32767) before one `madd` widens them to int32.
// The integers are the same exact sums, so the bits are those of every other path.

constexpr int64_t kStepBytes = 32;                  // 8 outputs x 4 weights
constexpr int64_t kBlockSteps = kQBlock / 4;        // steps per block of 32

// The 8 x 32 bytes of v[0..8) (8 W rows' quants, 4 per step) as 8 steps at out: step q holds
// dword q of every row (v3's and v4's ymm tiles). Pairs: as 4 pairs of steps instead, pair p
// (64 bytes at out + 64 p) holding qword p of every row, so that one zmm vpdpbusd covers two
// steps of the 8 outputs (v4's VNNI tiles; output n in dwords 2n and 2n + 1).
template <bool Pairs>
inline void store_steps(const __m256i* v, uint8_t* out) {
  if constexpr (!Pairs) {
    __m256i st[8];
    transpose8x8_epi32(v, st);
    for (int q = 0; q < 8; ++q) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + q * kStepBytes), st[q]);
  } else {
    __m256i lo[4], hi[4];  // rows 2i, 2i + 1: [qword 0s | qword 2s], [qword 1s | qword 3s]
    for (int i = 0; i < 4; ++i) {
      lo[i] = _mm256_unpacklo_epi64(v[2 * i], v[2 * i + 1]);
      hi[i] = _mm256_unpackhi_epi64(v[2 * i], v[2 * i + 1]);
    }
    // Qword p of the rows: p = 0, 1 in the low 128 bits of lo / hi, p = 2, 3 in the high ones
    // (the selectors are immediates, so written out).
    const auto store = [&](int p, __m256i a, __m256i b) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * p), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * p + 32), b);
    };
    store(0, _mm256_permute2x128_si256(lo[0], lo[1], 0x20), _mm256_permute2x128_si256(lo[2], lo[3], 0x20));
    store(1, _mm256_permute2x128_si256(hi[0], hi[1], 0x20), _mm256_permute2x128_si256(hi[2], hi[3], 0x20));
    store(2, _mm256_permute2x128_si256(lo[0], lo[1], 0x31), _mm256_permute2x128_si256(lo[2], lo[3], 0x31));
    store(3, _mm256_permute2x128_si256(hi[0], hi[1], 0x31), _mm256_permute2x128_si256(hi[2], hi[3], 0x31));
  }
}

// The 8 W rows' int32 v[n] dword j, output-major: out + 32 j holds dword j of every row (row n in
// dword n), for j < count.
inline void store_transposed(const __m256i* v, uint8_t* out, int count) {
  __m256i t[8];
  transpose8x8_epi32(v, t);
  for (int j = 0; j < count; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * j), t[j]);
}

// The 8 W rows' scales v[n] dword j (int16 values) as the tiles' int16 pairs: out + 32 j holds
// scale j of row n in int16 lanes 2n and 2n + 1.
inline void store_scale_pairs(const __m256i* v, uint8_t* out) {
  __m256i t[8];
  transpose8x8_epi32(v, t);
  for (int j = 0; j < 8; ++j)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * j),
                        _mm256_or_si256(_mm256_and_si256(t[j], _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(t[j], 16)));
}

#if defined(ASTRAI_ISA_V4)
// store_steps<true> from zmm: rows2[i] holds W rows 2i and 2i + 1 (32 bytes each); pair p (64
// bytes at out + 64 p) gets qword p of every row.
inline void store_step_pairs(const __m512i* rows2, uint8_t* out) {
  const __m512i q01 = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13), q23 = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
  for (int h = 0; h < 2; ++h) {  // rows 0-3 from rows2[0..1], rows 4-7 from rows2[2..3]
    const __m512i a = rows2[0], b = rows2[1], c = rows2[2], d = rows2[3];
    const __m512i x = _mm512_permutex2var_epi64(a, h == 0 ? q01 : q23, b);  // [rows 0-3 qword 2h | 2h + 1]
    const __m512i y = _mm512_permutex2var_epi64(c, h == 0 ? q01 : q23, d);
    _mm512_storeu_si512(out + 128 * h, _mm512_shuffle_i64x2(x, y, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm512_storeu_si512(out + 128 * h + 64, _mm512_shuffle_i64x2(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
}

// The 32 bytes at p and at p + stride in one zmm.
inline __m512i load_two(const uint8_t* p, int64_t stride) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(p)), load256(p + stride), 1);
}
// 16-bit lanes: 0 in the low 256 bits, s in the high ones.
inline __m512i high_half(int16_t s) { return _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(s), 1); }

// k_quants' bytes in zmm: the nibble of quant bytes v at each 16-bit lane's shift in nib (0: low,
// 4: high), Q5_K's fifth bit from qh at its lane's shift in bit above it (qh unused for Q4_K).
template <DType T>
inline __m512i k_nibbles(__m512i v, __m512i qh, __m512i nib, __m512i bit) {
  const __m512i q = _mm512_and_si512(_mm512_srlv_epi16(v, nib), _mm512_set1_epi8(15));
  if constexpr (T == DType::kQ4_K) return q;
  const __m512i fifth = _mm512_and_si512(_mm512_srlv_epi16(qh, bit), _mm512_set1_epi8(1));
  return _mm512_or_si512(q, _mm512_slli_epi16(fifth, 4));
}

// k_quants of two W rows at once (blk and blk + rb): lo / hi of row 0 in the low 256 bits, row 1
// in the high ones.
template <DType T>
inline void k_quants_two(const uint8_t* blk, int64_t rb, int c, __m512i* lo, __m512i* hi) {
  constexpr int64_t at = T == DType::kQ4_K ? kQ4KQuantsAt : kQ5KQuantsAt;
  const __m512i v = load_two(blk + at + 32 * c, rb);
  const __m512i qh = T == DType::kQ4_K ? _mm512_setzero_si512() : load_two(blk + kQ5KHighAt, rb);
  const __m512i bit = _mm512_set1_epi16(static_cast<int16_t>(2 * c));
  *lo = k_nibbles<T>(v, qh, _mm512_setzero_si512(), bit);
  *hi = k_nibbles<T>(v, qh, _mm512_set1_epi16(4), _mm512_add_epi16(bit, _mm512_set1_epi16(1)));
}

// k_quants of one W row as one zmm, lo (sub-block 2c) in the low 256 bits and hi (2c + 1) in the
// high ones: its 32 quant bytes broadcast to both halves and shifted per half, no shuffle.
template <DType T>
inline __m512i k_quants_both(const uint8_t* blk, int c) {
  constexpr int64_t at = T == DType::kQ4_K ? kQ4KQuantsAt : kQ5KQuantsAt;
  const __m512i v = _mm512_broadcast_i64x4(load256(blk + at + 32 * c));
  const __m512i qh = T == DType::kQ4_K ? _mm512_setzero_si512() : _mm512_broadcast_i64x4(load256(blk + kQ5KHighAt));
  const __m512i bit = _mm512_add_epi16(_mm512_set1_epi16(static_cast<int16_t>(2 * c)), high_half(1));
  return k_nibbles<T>(v, qh, high_half(4), bit);
}
#endif

// Q8_0 (VNNI only, see below): the 8 W rows at w as steps of signed bytes, each block's 8 steps
// followed by 128 * sum q_w of each output (int32); scales as interleave_q4_0's.
constexpr int64_t kQ8StepBlock = kBlockSteps * kStepBytes + 32;

// Q4_0: the 8 W rows at w (row stride rb, nb blocks) as nibble steps (kBlockSteps per block, in
// `steps`; with Pairs on v4 as signed values, kQ8StepBlock per block) and their scales as f32
// ([block][output], in `scales`).
template <bool Pairs>
void interleave_q4_0(const uint8_t* w, int64_t rb, int64_t nb, uint8_t* steps, float* scales) {
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int64_t b = 0; b < nb; ++b) {
    _mm256_storeu_ps(scales + b * 8, f16x8(w + b * kQ4BlockBytes, rb));
#if defined(ASTRAI_ISA_V4)
    if constexpr (Pairs) {  // 4 rows' 16 nibble bytes per zmm; a row's qwords 0, 1 are its low nibbles, 2, 3 its high
      const __m512i low4z = _mm512_set1_epi8(15);
      // As signed values q - 8 (kSignedQ4Steps), then 128 * sum (q - 8) per output.
      const __m512i eight = _mm512_set1_epi8(8);
      __m512i lo[2], hi[2], sums[2];
      for (int h = 0; h < 2; ++h) {
        const uint8_t* blk = w + 4 * h * rb + b * kQ4BlockBytes + 2;
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + rb)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 * rb)), 2);
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 3 * rb)), 3);
        const __m512i l = _mm512_and_si512(v, low4z), u = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4z);
        // Row 4h + n's sum of q in qwords 2n, 2n + 1.
        sums[h] = _mm512_sad_epu8(_mm512_add_epi8(l, u), _mm512_setzero_si512());
        lo[h] = _mm512_sub_epi8(l, eight);
        hi[h] = _mm512_sub_epi8(u, eight);
      }
      const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
      uint8_t* out = steps + b * kQ8StepBlock;
      _mm512_storeu_si512(out, _mm512_permutex2var_epi64(lo[0], even, lo[1]));
      _mm512_storeu_si512(out + 64, _mm512_permutex2var_epi64(lo[0], odd, lo[1]));
      _mm512_storeu_si512(out + 128, _mm512_permutex2var_epi64(hi[0], even, hi[1]));
      _mm512_storeu_si512(out + 192, _mm512_permutex2var_epi64(hi[0], odd, hi[1]));
      const __m512i per_row = _mm512_add_epi64(_mm512_permutex2var_epi64(sums[0], even, sums[1]),
                                               _mm512_permutex2var_epi64(sums[0], odd, sums[1]));  // qword n: row n
      const __m256i q_sum = _mm512_cvtepi64_epi32(per_row);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kBlockSteps * kStepBytes),
                          _mm256_slli_epi32(_mm256_sub_epi32(q_sum, _mm256_set1_epi32(8 * kQBlock)), 7));
      continue;
    }
#endif
    __m256i nib[8];
    for (int n = 0; n < 8; ++n) {
      const uint8_t* blk = w + n * rb + b * kQ4BlockBytes;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      nib[n] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low4);  // elements 0..31
    }
    store_steps<Pairs>(nib, steps + b * kBlockSteps * kStepBytes);
  }
}

// Q4_0, interleaved: R rows from i0 times the group.
template <int R>
void tile_q4_0_steps(const ActRows& a, int64_t i0, const uint8_t* steps, const float* scales, int64_t nb,
                     const float* bias, float* y, int64_t ldy) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t nbx = a.k / kQBlock;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i s16[R];
    for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int q = 0; q < kBlockSteps; ++q) {
      const __m256i wv = load256(steps + (b * kBlockSteps + q) * kStepBytes);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a.q + (i0 + r) * a.k + b * kQBlock + 4 * q;
        s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(wv, broadcast4(x)));
      }
    }
    const __m256 dw = _mm256_loadu_ps(scales + b * 8);
    for (int r = 0; r < R; ++r) {
      const __m256i s = _mm256_sub_epi32(_mm256_madd_epi16(s16[r], ones),
                                         _mm256_set1_epi32(8 * a.s32[(i0 + r) * nbx + b]));
      acc[r] = add_block(acc[r], dw, a.d[(i0 + r) * nbx + b], s);
    }
  }
  for (int r = 0; r < R; ++r) store_outputs(acc[r], bias, y + (i0 + r) * ldy);
}

// Q4_K and Q5_K, per super-block of the group (kQ4KSteps bytes): for each sub-block j its 8 steps
// of quants (nibbles; Q5_K's with their fifth bit),
// then 8 int16 pairs (sc_j of output n in lanes 2n, 2n+1) per sub-block, then per pair of
// sub-blocks (j, j + 1) the mins (m_j of output n in lane 2n, m_{j+1} in lane 2n + 1).
// The f32 d and dmin of the 8 outputs go to `scales` ([super-block][d x 8, dmin x 8]).
constexpr int64_t kQ4KSteps = 8 * kBlockSteps * kStepBytes + 8 * 32 + 4 * 32;

template <DType T, bool Pairs>
void interleave_q4_k(const uint8_t* w, int64_t rb, int64_t nb, uint8_t* steps, float* scales) {
  constexpr int64_t kBytes = block_bytes(T);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* out = steps + b * kQ4KSteps;
    for (int c = 0; c < 4; ++c) {  // sub-blocks 2c (low nibbles) and 2c + 1 (high)
#if defined(ASTRAI_ISA_V4)
      if constexpr (Pairs) {  // two rows per zmm
        __m512i lo[4], hi[4];
        for (int i = 0; i < 4; ++i) k_quants_two<T>(w + 2 * i * rb + b * kBytes, rb, c, &lo[i], &hi[i]);
        store_step_pairs(lo, out + (2 * c) * kBlockSteps * kStepBytes);
        store_step_pairs(hi, out + (2 * c + 1) * kBlockSteps * kStepBytes);
        continue;
      }
#endif
      __m256i lo[8], hi[8];
      for (int n = 0; n < 8; ++n) k_quants<T>(w + n * rb + b * kBytes, c, &lo[n], &hi[n]);
      store_steps<Pairs>(lo, out + (2 * c) * kBlockSteps * kStepBytes);
      store_steps<Pairs>(hi, out + (2 * c + 1) * kBlockSteps * kStepBytes);
    }
    __m256i sc[8], mins[8];  // row n: its 8 scales as int32; its mins as 4 int32 (m_2p, m_2p+1) int16 pairs
    for (int n = 0; n < 8; ++n) {
      const __m128i v = q4k_scales_mins(w + n * rb + b * kBytes);
      sc[n] = _mm256_cvtepu8_epi32(v);
      mins[n] = _mm256_zextsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(v, 8)));
    }
    store_scale_pairs(sc, out + 8 * kBlockSteps * kStepBytes);
    store_transposed(mins, out + 8 * kBlockSteps * kStepBytes + 8 * 32, 4);
    _mm256_storeu_ps(scales + b * 16, f16x8(w + b * kBytes, rb));
    _mm256_storeu_ps(scales + b * 16 + 8, f16x8(w + b * kBytes + 2, rb));
  }
}

// Q4_K / Q5_K steps, the part after the quants' sums sa (per output, times the sub-block
// scales): the mins' sums sb, then acc += d d_x sa - dmin d_x sb for each row.
template <int R>
inline void finish_q4_k_block(const ActRows& a, int64_t i0, const uint8_t* blk, const float* scales, int64_t b,
                              const __m256i* sa, __m256* acc) {
  __m256i sb[R];
  for (int r = 0; r < R; ++r) sb[r] = _mm256_setzero_si256();
  for (int jp = 0; jp < 4; ++jp) {
    const __m256i mv = load256(blk + 8 * kBlockSteps * kStepBytes + 8 * 32 + 32 * jp);
    for (int r = 0; r < R; ++r) {  // the sums of q_x over sub-blocks 2jp and 2jp + 1, two int16
      const int16_t* xs = a.s32 + (i0 + r) * (a.k / 32) + b * 8 + 2 * jp;
      sb[r] = _mm256_add_epi32(sb[r], _mm256_madd_epi16(mv, broadcast4(xs)));
    }
  }
  const int64_t nbx = a.k / kQKBlock;
  const __m256 d = _mm256_loadu_ps(scales + b * 16), dmin = _mm256_loadu_ps(scales + b * 16 + 8);
  for (int r = 0; r < R; ++r) acc[r] = add_k_block(acc[r], d, dmin, a.d[(i0 + r) * nbx + b], sa[r], sb[r]);
}

// Q4_K / Q5_K, interleaved: R rows from i0 times the group. Q5_K's products (at most 31 * 127
// per byte pair) add up in int16 over half a sub-block (8 * 31 * 127 = 31496), then `madd` by
// the scale; Q4_K's over a whole one.
template <DType T, int R>
void tile_q4_k_steps(const ActRows& a, int64_t i0, const uint8_t* steps, const float* scales, int64_t nb,
                     const float* bias, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = steps + b * kQ4KSteps;
    __m256i sa[R];
    for (int r = 0; r < R; ++r) sa[r] = _mm256_setzero_si256();
    constexpr int kSumSteps = T == DType::kQ5_K ? kBlockSteps / 2 : kBlockSteps;
    for (int j = 0; j < 8; ++j) {
      const __m256i scv = load256(blk + 8 * kBlockSteps * kStepBytes + 32 * j);
#pragma GCC unroll 2
      for (int q0 = 0; q0 < kBlockSteps; q0 += kSumSteps) {
        __m256i s16[R];
        for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int q = q0; q < q0 + kSumSteps; ++q) {
          const __m256i wv = load256(blk + (j * kBlockSteps + q) * kStepBytes);
          for (int r = 0; r < R; ++r) {
            const int8_t* x = a.q + (i0 + r) * a.k + b * kQKBlock + 32 * j + 4 * q;
            s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(wv, broadcast4(x)));
          }
        }
        for (int r = 0; r < R; ++r) sa[r] = _mm256_add_epi32(sa[r], _mm256_madd_epi16(s16[r], scv));
      }
    }
    finish_q4_k_block<R>(a, i0, blk, scales, b, sa, acc);
  }
  for (int r = 0; r < R; ++r) store_outputs(acc[r], bias, y + (i0 + r) * ldy);
}

// Q6_K, per super-block of the group (kQ6KSteps bytes): its 64 steps of 6-bit values (element
// order), then per group of 16 elements an int16 pair vector (sc_g of output n in lanes 2n, 2n+1),
// then per pair of groups (g, g + 1) sc_g of output n in lane 2n and sc_{g+1} in 2n + 1 (for the
// -32 offset). The f32 d of the 8 outputs go to `scales` ([super-block][d x 8]).
constexpr int64_t kQ6KSteps = 64 * kStepBytes + 16 * 32 + 8 * 32;

template <bool Pairs>
void interleave_q6_k(const uint8_t* w, int64_t rb, int64_t nb, uint8_t* steps, float* scales) {
  const __m256i low4 = _mm256_set1_epi8(15), low2 = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* out = steps + b * kQ6KSteps;
    for (int c = 0; c < 2; ++c)
      for (int t = 0; t < 4; ++t) {  // elements 128 c + 32 t + 0..31
        __m256i q[8];
        for (int n = 0; n < 8; ++n) {
          const uint8_t* blk = w + n * rb + b * kQ6KBlockBytes;
          const __m256i ql = load256(blk + 64 * c + 32 * (t % 2)), qh = load256(blk + kQ6KHighAt + 32 * c);
          const __m256i lo = _mm256_and_si256(t < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
          const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), low2), 4);
          q[n] = _mm256_or_si256(lo, hi);
        }
        store_steps<Pairs>(q, out + (128 * c + 32 * t) / 4 * kStepBytes);
      }
    __m256i sc0[8], sc1[8], pairs[8];  // row n: its scales 0-7 and 8-15 as int32; (s_2p, s_2p+1) int16 pairs
    for (int n = 0; n < 8; ++n) {
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + n * rb + b * kQ6KBlockBytes + kQ6KScalesAt));
      sc0[n] = _mm256_cvtepi8_epi32(s8);
      sc1[n] = _mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8));
      pairs[n] = _mm256_cvtepi8_epi16(s8);
    }
    store_scale_pairs(sc0, out + 64 * kStepBytes);
    store_scale_pairs(sc1, out + 64 * kStepBytes + 8 * 32);
    store_transposed(pairs, out + 64 * kStepBytes + 16 * 32, 8);
    _mm256_storeu_ps(scales + b * 16, f16x8(w + b * kQ6KBlockBytes + kQ6KDAt, rb));
  }
}

// Q6_K steps, the part after the sums sa (per output, times the group scales): minus the -32
// offset's 32 * sum_g sc_g * sum(q_x over g), then acc += d d_x sa for each row.
template <int R>
inline void finish_q6_k_block(const ActRows& a, int64_t i0, const uint8_t* blk, const float* scales, int64_t b,
                              __m256i* sa, __m256* acc) {
  for (int r = 0; r < R; ++r) {
    __m256i off = _mm256_setzero_si256();
    for (int gp = 0; gp < 8; ++gp) {
      const int16_t* xs = a.s16 + (i0 + r) * (a.k / 16) + b * 16 + 2 * gp;
      const __m256i pairs = load256(blk + 64 * kStepBytes + 16 * 32 + 32 * gp);
      off = _mm256_add_epi32(off, _mm256_madd_epi16(pairs, broadcast4(xs)));
    }
    sa[r] = _mm256_sub_epi32(sa[r], _mm256_slli_epi32(off, 5));
  }
  const int64_t nbx = a.k / kQKBlock;
  const __m256 d = _mm256_loadu_ps(scales + b * 16);
  for (int r = 0; r < R; ++r) acc[r] = add_block(acc[r], d, a.d[(i0 + r) * nbx + b], sa[r]);
}

// Q6_K, interleaved: R rows from i0 times the group. Two steps of 6-bit products (at most
// 63 * 127 per byte pair) add up in int16 (4 * 63 * 127 = 32004) before each `madd` by sc_g.
template <int R>
void tile_q6_k_steps(const ActRows& a, int64_t i0, const uint8_t* steps, const float* scales, int64_t nb,
                     const float* bias, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = steps + b * kQ6KSteps;
    __m256i sa[R];
    for (int r = 0; r < R; ++r) sa[r] = _mm256_setzero_si256();
    for (int g = 0; g < 16; ++g) {
      const __m256i scv = load256(blk + 64 * kStepBytes + 32 * g);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int q0 = 4 * g + 2 * h;
        const __m256i w0 = load256(blk + q0 * kStepBytes), w1 = load256(blk + (q0 + 1) * kStepBytes);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = a.q + (i0 + r) * a.k + b * kQKBlock + 4 * q0;
          const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, broadcast4(x)),
                                               _mm256_maddubs_epi16(w1, broadcast4(x + 4)));
          sa[r] = _mm256_add_epi32(sa[r], _mm256_madd_epi16(s16, scv));
        }
      }
    }
    finish_q6_k_block<R>(a, i0, blk, scales, b, sa, acc);
  }
  for (int r = 0; r < R; ++r) store_outputs(acc[r], bias, y + (i0 + r) * ldy);
}

template <bool Pairs>
void interleave_q8_0(const uint8_t* w, int64_t rb, int64_t nb, uint8_t* steps, float* scales) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i v[8], sums[8];
    for (int n = 0; n < 8; ++n) {
      v[n] = load256(w + n * rb + b * kQ8BlockBytes + 2);
      sums[n] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v[n]), ones16);
    }
    uint8_t* out = steps + b * kQ8StepBlock;
    store_steps<Pairs>(v, out);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kBlockSteps * kStepBytes),
                        _mm256_slli_epi32(reduce_outputs(sums), 7));
    _mm256_storeu_ps(scales + b * 8, f16x8(w + b * kQ8BlockBytes, rb));
  }
}

// ---- VNNI: vpdpbusd (AVX-VNNI under v3, AVX-512 VNNI with VL under v4) ----
//
// vpdpbusd adds the four products of unsigned and signed bytes in each dword straight into an
// int32 lane, with no int16 stage to saturate: one instruction per step where the code above
// needs maddubs + add, and a sub-block's sum (Q4_K, Q5_K) or group's (Q6_K) is times its scale
// by one `mullo` instead of a `madd` per 4 to 8 steps (v4's Q4_K: one vpdpwssd per two rows,
// q4_k_pair_sums). Q8_0's signed weights interleave too: its
// activations go in as q_x + 128 (unsigned bytes) against the signed weights, and each output's
// 128 * sum q_w, stored after the block's steps, is subtracted. The same exact integer sums, so
// the same bits. These functions are compiled for the level plus its VNNI extension (namespace
// vnni; scripts/check-isa.py checks that no other function holds VNNI instructions) and run
// only where the CPU has it (use_vnni).

#if defined(ASTRAI_ISA_V4)
constexpr Isa kLevel = Isa::kV4;
#else
constexpr Isa kLevel = Isa::kV3;
#endif

bool use_vnni() {
  static const bool has = cpu_has(vnni_feature(kLevel));
  return has && vnni_allowed();
}

#if defined(ASTRAI_ISA_V4)
#define ASTRAI_VNNI_TARGET ASTRAI_PRAGMA(GCC target("avx512vnni"))
#else
#define ASTRAI_VNNI_TARGET ASTRAI_PRAGMA(GCC target("avxvnni"))
#endif
ASTRAI_PRAGMA(GCC push_options)
ASTRAI_VNNI_TARGET
namespace vnni {

// One vpdpbusd "op" covers kOpSteps steps of the group's 8 outputs: on v3 one step (ymm, output
// n in dword n, 4 activation bytes broadcast), on v4 two (zmm over the pairs of store_steps<true>,
// output n in dwords 2n and 2n + 1, 8 activation bytes broadcast to every qword; twice the
// products per instruction). output_sums folds a vector of per-lane sums into the 8 outputs' int32.
// kKChains: accumulator chains per row in the k-quant tiles (v3's 4-row tiles need two to hide
// the instruction's latency; v4's 8 rows give enough independent chains).
#if defined(ASTRAI_ISA_V4)
using IVec = __m512i;
constexpr int kOpSteps = 2, kKChains = 1;
inline IVec izero() { return _mm512_setzero_si512(); }
inline IVec load_op(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline IVec x_op(const void* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm512_set1_epi64(v);
}
inline IVec dpbusd(IVec acc, IVec u8, IVec s8) { return _mm512_dpbusd_epi32(acc, u8, s8); }
inline IVec iadd(IVec x, IVec y) { return _mm512_add_epi32(x, y); }
inline IVec imul(IVec x, IVec y) { return _mm512_mullo_epi32(x, y); }
inline __m256i output_sums(IVec v) { return _mm512_cvtepi64_epi32(_mm512_add_epi32(v, _mm512_srli_epi64(v, 32))); }
// A scale vector of (s, s) int16 pairs per output as int32 s in the output's lanes.
inline IVec op_scales(const uint8_t* p) { return _mm512_cvtepi16_epi32(load256(p)); }
#else
using IVec = __m256i;
constexpr int kOpSteps = 1, kKChains = 2;
inline IVec izero() { return _mm256_setzero_si256(); }
inline IVec load_op(const uint8_t* p) { return load256(p); }
inline IVec x_op(const void* p) { return broadcast4(p); }
inline IVec dpbusd(IVec acc, IVec u8, IVec s8) { return _mm256_dpbusd_avx_epi32(acc, u8, s8); }
inline IVec iadd(IVec x, IVec y) { return _mm256_add_epi32(x, y); }
inline IVec imul(IVec x, IVec y) { return _mm256_mullo_epi32(x, y); }
inline __m256i output_sums(IVec v) { return v; }
inline IVec op_scales(const uint8_t* p) { return _mm256_srai_epi32(load256(p), 16); }
#endif
constexpr int64_t kOpBytes = kOpSteps * kStepBytes;  // weight bytes per op
constexpr int64_t kOpX = 4 * kOpSteps;               // activation bytes per op

#if defined(ASTRAI_ISA_V4)
// The 8 outputs' sums of rows r (u) and r + 1 (v) in one zmm, output n in dwords 2n (row r) and
// 2n + 1 (row r + 1).
inline __m512i pair_sums(__m512i u, __m512i v) {
  return _mm512_mask_blend_epi32(0xaaaa, _mm512_add_epi32(u, _mm512_srli_epi64(u, 32)),
                                 _mm512_add_epi32(v, _mm512_slli_epi64(v, 32)));
}
// Each of the 8 outputs' values in both lanes of its pair (2n, 2n + 1).
inline __m512 pair_outputs(__m256 v) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                               _mm512_castps256_ps512(v));
}
inline __m512i pair_outputs(__m256i v) {
  return _mm512_castps_si512(pair_outputs(_mm256_castsi256_ps(v)));
}
// d_x of block b for rows r (even lanes) and r + 1 (odd lanes), at = row r's index into a.d.
inline __m512 pair_dx(const ActRows& a, int64_t at, int64_t nbx) {
  return _mm512_mask_broadcastss_ps(_mm512_set1_ps(a.d[at]), 0xaaaa, _mm_set_ss(a.d[at + nbx]));
}
// The rows of the pairs' accumulators (pair_sums' layout) back into acc[0, R & ~1).
template <int R>
inline void split_pairs(const __m512* acc2, __m256* acc) {
  for (int r = 0; r + 1 < R; r += 2) {
    const __m512i v = _mm512_castps_si512(acc2[r / 2]);
    acc[r] = _mm256_castsi256_ps(_mm512_cvtepi64_epi32(v));
    acc[r + 1] = _mm256_castsi256_ps(_mm512_cvtepi64_epi32(_mm512_srli_epi64(v, 32)));
  }
}
#endif

// The tiles below take G groups of 8 W rows at once (steps[g], scales[g]; outputs 8g.. at y + 8g):
// each activation broadcast then feeds G vpdpbusd. G = 2 and 3 (v4, rows in tiles of 4;
// outputs_steps) need 0.75 and 0.58 loads per vpdpbusd against 1.125 for one group by 8 rows, and
// the loads bound these tiles more than the vpdpbusd (Zen 5: 4 rows x 2 groups ran a microbenchmark
// of the loop 1.25-1.4x faster than 8 rows x 1); the k-quants' scale multiplies and the blocks'
// float endings take the units vpdpbusd needs (probes without them, wrong results: Q4_K
// 1.12-1.2x, Q4_0 and Q8_0 1.25-1.3x faster). Each group's sums and their ending are the same
// either way, so the bits.

// The float accumulators of a tile: per group, one ymm per row, and on v4 one zmm per pair of rows.
template <int G, int R>
struct TileAcc {
  __m256 acc[G][R];
#if defined(ASTRAI_ISA_V4)
  __m512 acc2[G][(R + 1) / 2];
#endif
  TileAcc() {
    for (int g = 0; g < G; ++g) {
      for (int r = 0; r < R; ++r) acc[g][r] = _mm256_setzero_ps();
#if defined(ASTRAI_ISA_V4)
      for (int p = 0; p < (R + 1) / 2; ++p) acc2[g][p] = _mm512_setzero_ps();
#endif
    }
  }
  // Every row's outputs (+ bias) to y; pairs: v4's rows in pairs are in acc2 (all but an odd last).
  void store(const float* bias, float* y, int64_t i0, int64_t ldy, [[maybe_unused]] bool pairs) {
    for (int g = 0; g < G; ++g) {
#if defined(ASTRAI_ISA_V4)
      if (pairs) split_pairs<R>(acc2[g], acc[g]);
#endif
      for (int r = 0; r < R; ++r) store_outputs(acc[g][r], bias ? bias + 8 * g : nullptr, y + (i0 + r) * ldy + 8 * g);
    }
  }
};

// Q8_0 or Q4_0, the end of block b of group g: acc[r] += (d_w d_x) * float(sum - c), v4 two rows
// per zmm (pair_sums) in acc2, each lane ended as add_block ends it.
template <DType T, int G, int R>
inline void end_q32_block(const ActRows& a, int64_t i0, const uint8_t* blk, const float* scales, int64_t b,
                          const IVec* s, TileAcc<G, R>& t, int g) {
  __m256* acc = t.acc[g];
  constexpr bool kSigned = signed_steps(T);  // signed steps, 128 * sum q_w after
  const int64_t nbx = a.k / kQBlock;
  const __m256 dw = _mm256_loadu_ps(scales + b * 8);
  int r = 0;
#if defined(ASTRAI_ISA_V4)
  static_assert(kSigned);
  const __m512 dw2 = pair_outputs(dw);
  const __m512i c2 = pair_outputs(load256(blk + kBlockSteps * kStepBytes));
  for (; r + 1 < R; r += 2) {
    const __m512 dx2 = pair_dx(a, (i0 + r) * nbx + b, nbx);
    __m512& acc2 = t.acc2[g][r / 2];
    acc2 = _mm512_fmadd_ps(_mm512_mul_ps(dw2, dx2), _mm512_cvtepi32_ps(_mm512_sub_epi32(pair_sums(s[r], s[r + 1]), c2)),
                           acc2);
  }
#endif
  for (; r < R; ++r) {
    const __m256i c = kSigned ? load256(blk + kBlockSteps * kStepBytes)  // 128 * sum q_w
                              : _mm256_set1_epi32(8 * a.s32[(i0 + r) * nbx + b]);  // nibble - 8
    acc[r] = add_block(acc[r], dw, a.d[(i0 + r) * nbx + b], _mm256_sub_epi32(output_sums(s[r]), c));
  }
}

// Q8_0 or Q4_0 steps (interleave_q8_0, interleave_q4_0): R rows from i0 times G groups.
template <DType T, int G, int R>
void tile_q32_steps(const ActRows& a, int64_t i0, const uint8_t* const* steps, const float* const* scales,
                    int64_t nb, const float* bias, float* y, int64_t ldy) {
  constexpr bool kSigned = signed_steps(T);
  constexpr int64_t kBlockBytes = kSigned ? kQ8StepBlock : kBlockSteps * kStepBytes;
  TileAcc<G, R> t;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk[G];
    IVec s[G][R];
    for (int g = 0; g < G; ++g) {
      blk[g] = steps[g] + b * kBlockBytes;
      for (int r = 0; r < R; ++r) s[g][r] = izero();
    }
#pragma GCC unroll 8
    for (int o = 0; o < kBlockSteps / kOpSteps; ++o) {
      IVec wv[G];
      for (int g = 0; g < G; ++g) wv[g] = load_op(blk[g] + o * kOpBytes);
      for (int r = 0; r < R; ++r) {
        const int64_t at = (i0 + r) * a.k + b * kQBlock + kOpX * o;
        const IVec x = x_op(kSigned ? a.qu + at : reinterpret_cast<const uint8_t*>(a.q + at));
        for (int g = 0; g < G; ++g) s[g][r] = kSigned ? dpbusd(s[g][r], x, wv[g]) : dpbusd(s[g][r], wv[g], x);
      }
    }
    for (int g = 0; g < G; ++g) end_q32_block<T, G, R>(a, i0, blk[g], scales[g], b, s[g], t, g);
  }
  t.store(bias, y, i0, ldy, true);
}

// s[c][g][r] = row r's products with group g's kSteps steps at st[g] (x at row offset x_off),
// summed in kChains chains per row (chain c takes every kChains-th op).
template <int G, int R, int kSteps, int kChains>
inline void step_sums(const ActRows& a, int64_t i0, int64_t x_off, const uint8_t* const* st, IVec (*s)[G][R]) {
  for (int c = 0; c < kChains; ++c)
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < R; ++r) s[c][g][r] = izero();
#pragma GCC unroll 8
  for (int o = 0; o < kSteps / kOpSteps; o += kChains) {
#pragma GCC unroll 2
    for (int c = 0; c < kChains; ++c) {
      IVec wv[G];
      for (int g = 0; g < G; ++g) wv[g] = load_op(st[g] + (o + c) * kOpBytes);
      for (int r = 0; r < R; ++r) {
        const IVec x = x_op(a.q + (i0 + r) * a.k + x_off + kOpX * (o + c));
        for (int g = 0; g < G; ++g) s[c][g][r] = dpbusd(s[c][g][r], wv[g], x);
      }
    }
  }
}

// sa[g][r] += scale[g] * (row r's products with group g's kSteps steps at st[g], x at row offset
// x_off), the products summed in kKChains chains per row: one sub-block (Q4_K, Q5_K) or group
// (Q6_K).
template <int G, int R, int kSteps>
inline void add_scaled_sums(const ActRows& a, int64_t i0, int64_t x_off, const uint8_t* const* st, const IVec* scale,
                            IVec (*sa)[R]) {
  IVec s[kKChains][G][R];
  step_sums<G, R, kSteps, kKChains>(a, i0, x_off, st, s);
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) {
      IVec sum = s[0][g][r];
      for (int c = 1; c < kKChains; ++c) sum = iadd(sum, s[c][g][r]);
      sa[g][r] = iadd(sa[g][r], imul(sum, scale[g]));
    }
}

// sa[g][r] = add_scaled_sums over the kCount sub-blocks of super-block b (Q4_K, Q5_K: 8 of 32
// weights; Q6_K: 16 groups of 16): sub-block j's kSteps steps at blk[g] + j kSteps steps, the
// sub-blocks' int16 scale pairs after all of them (32 bytes each).
template <int G, int R, int kCount, int kSteps>
inline void super_block_sums(const ActRows& a, int64_t i0, int64_t b, const uint8_t* const* blk, IVec (*sa)[R]) {
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) sa[g][r] = izero();
  for (int j = 0; j < kCount; ++j) {
    const uint8_t* st[G];
    IVec scale[G];
    for (int g = 0; g < G; ++g) {
      st[g] = blk[g] + j * kSteps * kStepBytes;
      scale[g] = op_scales(blk[g] + kCount * kSteps * kStepBytes + 32 * j);
    }
    add_scaled_sums<G, R, kSteps>(a, i0, b * kQKBlock + 4 * kSteps * j, st, scale, sa);
  }
}

#if defined(ASTRAI_ISA_V4)
// finish_q4_k_block for the pairs of rows (r, r + 1), r < R - 1, their sums sa in sums2[r / 2]
// (pair_sums' layout): the sums of the 8 W rows' mins times the sub-blocks' sums of q_x by
// vpdpwssd (madd and add in one), and each lane's two fused multiply-adds as add_k_block's.
template <int R>
inline void finish_q4_k_pairs(const ActRows& a, int64_t i0, const uint8_t* blk, const float* scales, int64_t b,
                              const __m512i* sums2, __m512* acc2) {
  const __m512 d2 = pair_outputs(_mm256_loadu_ps(scales + b * 16));
  const __m512 dmin2 = pair_outputs(_mm256_loadu_ps(scales + b * 16 + 8));
  __m512i mv2[4];  // per pair of sub-blocks: each output's two mins (int16), in both lanes of its pair
  for (int jp = 0; jp < 4; ++jp)
    mv2[jp] = pair_outputs(load256(blk + 8 * kBlockSteps * kStepBytes + 8 * 32 + 32 * jp));
  const int64_t nbx = a.k / kQKBlock, xs_stride = a.k / 32;
  for (int r = 0; r + 1 < R; r += 2) {
    const int16_t* xs0 = a.s32 + (i0 + r) * xs_stride + b * 8;
    __m512i sb = _mm512_setzero_si512();
    for (int jp = 0; jp < 4; ++jp) {  // rows r, r + 1's sums of q_x over sub-blocks 2jp, 2jp + 1
      int32_t v0, v1;
      std::memcpy(&v0, xs0 + 2 * jp, 4);
      std::memcpy(&v1, xs0 + xs_stride + 2 * jp, 4);
      sb = _mm512_dpwssd_epi32(sb, mv2[jp], _mm512_mask_set1_epi32(_mm512_set1_epi32(v0), 0xaaaa, v1));
    }
    const __m512 dx2 = pair_dx(a, (i0 + r) * nbx + b, nbx);
    const __m512 t =
        _mm512_fmadd_ps(_mm512_mul_ps(d2, dx2), _mm512_cvtepi32_ps(sums2[r / 2]), acc2[r / 2]);
    acc2[r / 2] = _mm512_fmadd_ps(_mm512_mul_ps(dmin2, dx2),
                                  _mm512_xor_ps(_mm512_cvtepi32_ps(sb), _mm512_set1_ps(-0.0f)), t);
  }
}
#endif

#if defined(ASTRAI_ISA_V4)
// Q4_K's super_block_sums on v4, rows in pairs: a sub-block's dwords (four ops, at most
// 4 * 4 * 15 * 127 = 30480 each) fit in int16, so one vpackssdw puts rows r and r + 1 in the
// 16-bit halves of one vector (no saturation) and one vpdpwssd multiplies both by the sub-block's
// scales and adds them: per pair of rows and sub-block one multiply where mullo needs two
// (gemm_bench, one thread: 1.04-1.06x at 32 rows, 1.05x at 512). Per 128-bit lane L the packed
// vector holds row r's outputs 2L, 2L + 1 (one dword each, its two halves added by vpdpwssd),
// then row r + 1's; sums2[g][r / 2] ends in pair_sums' layout. An odd last row goes through
// mullo (sa_last). The same exact integers as super_block_sums.
template <int G, int R>
inline void q4_k_pair_sums(const ActRows& a, int64_t i0, int64_t b, const uint8_t* const* blk,
                           __m512i (*sums2)[(R + 1) / 2], __m512i* sa_last) {
  constexpr int P = R / 2;
  __m512i sp[G][P > 0 ? P : 1];
  for (int g = 0; g < G; ++g) {
    for (int p = 0; p < P; ++p) sp[g][p] = izero();
    sa_last[g] = izero();
  }
  const __m512i dup = _mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3);  // lane L: qword L twice
  for (int j = 0; j < 8; ++j) {
    const uint8_t* st[G];
    for (int g = 0; g < G; ++g) st[g] = blk[g] + j * kBlockSteps * kStepBytes;
    IVec chains[1][G][R];
    step_sums<G, R, kBlockSteps, 1>(a, i0, b * kQKBlock + 32 * j, st, chains);
    IVec (&s)[G][R] = chains[0];
    for (int g = 0; g < G; ++g) {
      const uint8_t* scp = blk[g] + 8 * kBlockSteps * kStepBytes + 32 * j;  // (s, s) int16 per output
      const __m512i sc2 = _mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(load256(scp)));
      for (int p = 0; p < P; ++p)
        sp[g][p] = _mm512_dpwssd_epi32(sp[g][p], _mm512_packs_epi32(s[g][2 * p], s[g][2 * p + 1]), sc2);
      if constexpr (R % 2 == 1) sa_last[g] = iadd(sa_last[g], imul(s[g][R - 1], op_scales(scp)));
    }
  }
  for (int g = 0; g < G; ++g)
    for (int p = 0; p < P; ++p) sums2[g][p] = _mm512_shuffle_epi32(sp[g][p], _MM_PERM_ENUM(0xd8));
}
#endif

// Q4_K / Q5_K steps (interleave_q4_k): R rows from i0 times G groups.
template <DType T, int G, int R>
void tile_q4_k_steps(const ActRows& a, int64_t i0, const uint8_t* const* steps, const float* const* scales,
                     int64_t nb, const float* bias, float* y, int64_t ldy) {
  TileAcc<G, R> t;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk[G];
    for (int g = 0; g < G; ++g) blk[g] = steps[g] + b * kQ4KSteps;
#if defined(ASTRAI_ISA_V4)
    __m512i sums2[G][(R + 1) / 2], last[G];
    if constexpr (T == DType::kQ4_K) {
      q4_k_pair_sums<G, R>(a, i0, b, blk, sums2, last);
    } else {
      IVec sa[G][R];
      super_block_sums<G, R, 8, kBlockSteps>(a, i0, b, blk, sa);
      for (int g = 0; g < G; ++g) {
        for (int r = 0; r + 1 < R; r += 2) sums2[g][r / 2] = pair_sums(sa[g][r], sa[g][r + 1]);
        last[g] = sa[g][R - 1];
      }
    }
    for (int g = 0; g < G; ++g) {
      finish_q4_k_pairs<R>(a, i0, blk[g], scales[g], b, sums2[g], t.acc2[g]);
      if constexpr (R % 2 == 1) {
        const __m256i sum = output_sums(last[g]);
        finish_q4_k_block<1>(a, i0 + R - 1, blk[g], scales[g], b, &sum, &t.acc[g][R - 1]);
      }
    }
#else
    IVec sa[G][R];
    super_block_sums<G, R, 8, kBlockSteps>(a, i0, b, blk, sa);
    for (int g = 0; g < G; ++g) {
      __m256i sums[R];
      for (int r = 0; r < R; ++r) sums[r] = output_sums(sa[g][r]);
      finish_q4_k_block<R>(a, i0, blk[g], scales[g], b, sums, t.acc[g]);
    }
#endif
  }
  t.store(bias, y, i0, ldy, true);
}

// Q6_K steps (interleave_q6_k): R rows from i0 times G groups.
template <int G, int R>
void tile_q6_k_steps(const ActRows& a, int64_t i0, const uint8_t* const* steps, const float* const* scales,
                     int64_t nb, const float* bias, float* y, int64_t ldy) {
  TileAcc<G, R> t;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk[G];
    for (int g = 0; g < G; ++g) blk[g] = steps[g] + b * kQ6KSteps;
    IVec sa[G][R];
    super_block_sums<G, R, 16, 4>(a, i0, b, blk, sa);
    for (int g = 0; g < G; ++g) {
      __m256i sums[R];
      for (int r = 0; r < R; ++r) sums[r] = output_sums(sa[g][r]);
      finish_q6_k_block<R>(a, i0, blk[g], scales[g], b, sums, t.acc[g]);
    }
  }
  t.store(bias, y, i0, ldy, false);
}

#if defined(ASTRAI_ISA_V4)
// The two 256-bit halves of v added dword by dword.
inline __m256i add_halves(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }
// The high 8 floats of v.
inline __m256 high_ps(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// Few rows (decode), W read in place, Q4_K / Q5_K: R rows from i0 times the 8 W rows at w, as
// tile_q4k without its int16 stage. One zmm holds the 64 quants of sub-blocks 2c and 2c + 1
// (low nibbles, then high), against the 64 activation bytes of those sub-blocks as they lie in
// memory: vpdpbusd sums them four at a time per dword, and vpdpwssd multiplies each dword by its
// sub-block's scale and adds it to the row's sums (a dword of at most 4 * 31 * 127 fits in its
// low int16; the scale is the low int16 of the other operand's dword, with 0 above it). The
// integers are tile_q4k's exact sums, so the bits are the same.
template <DType T, int R>
void tile_q4k_in_place(const ActRows& a, int64_t i0, const uint8_t* w, int64_t rb, int64_t nb, const float* bias,
                       float* y, int64_t ldy, const uint8_t* pf) {
  constexpr int64_t kBytes = block_bytes(T);
  const int64_t nbx = a.k / kQKBlock;
  __m512i pick[4];  // dwords 0-7: scale 2c, 8-15: scale 2c + 1
  for (int c = 0; c < 4; ++c)
    pick[c] = _mm512_inserti64x4(_mm512_set1_epi32(2 * c), _mm256_set1_epi32(2 * c + 1), 1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_share(pf, b, 8 * kBytes);
    __m256i part[R][8];
    __m128i mins8[8];  // the 8 W rows' mins in their low 8 bytes
    for (int n = 0; n < 8; ++n) {
      const uint8_t* blk = w + n * rb + b * kBytes;
      const __m128i sm = q4k_scales_mins(blk);
      mins8[n] = _mm_srli_si128(sm, 8);
      const __m512i sc = _mm512_cvtepu8_epi32(sm);
      __m512i s[R];
      for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i q = k_quants_both<T>(blk, c);
        const __m512i scv = _mm512_permutexvar_epi32(pick[c], sc);
        for (int r = 0; r < R; ++r) {
          const __m512i x = _mm512_loadu_si512(a.q + (i0 + r) * a.k + b * kQKBlock + 64 * c);
          s[r] = _mm512_dpwssd_epi32(s[r], _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x), scv);
        }
      }
      for (int r = 0; r < R; ++r)
        part[r][n] = add_halves(s[r]);
    }
    // The mins' sums of the 8 W rows at once: 128-bit lane n of mq0 (mq1) holds W row n's
    // (n + 4's) 8 mins as int16; madd by the row's 8 sub-block sums of q_x leaves 4 dwords per
    // W row, added up by the unpacks and the shuffle (W row n in dword 0 of lane n, n + 4 in
    // dword 1) and gathered in order.
    const auto rows4 = [&](int n) {  // the mins of W rows n..n + 3, 8 bytes each
      return _mm256_set_m128i(_mm_unpacklo_epi64(mins8[n + 2], mins8[n + 3]), _mm_unpacklo_epi64(mins8[n], mins8[n + 1]));
    };
    const __m512i mq0 = _mm512_cvtepu8_epi16(rows4(0)), mq1 = _mm512_cvtepu8_epi16(rows4(4));
    const __m512i gather = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256 d = f16x8(w + b * kBytes, rb), dmin = f16x8(w + b * kBytes + 2, rb);
    for (int r = 0; r < R; ++r) {
      const __m512i xs = _mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.s32 + (i0 + r) * (a.k / 32) + b * 8)));
      const __m512i p0 = _mm512_madd_epi16(mq0, xs), p1 = _mm512_madd_epi16(mq1, xs);
      const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
      const __m512i u = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));
      const __m256i mins = _mm512_castsi512_si256(_mm512_permutexvar_epi32(gather, u));
      acc[r] = add_k_block(acc[r], d, dmin, a.d[(i0 + r) * nbx + b], reduce_outputs(part[r]), mins);
    }
  }
  for (int r = 0; r < R; ++r) store_outputs(acc[r], bias, y + (i0 + r) * ldy);
}

// Few rows (decode), W read in place, Q6_K: R rows from i0 times the 8 W rows at w. For each
// half c of a super-block, one zmm holds the 6-bit values of elements 128 c + 0..63 (the low
// nibbles of the 64 ql bytes, qh's bits 0-1 and 2-3 above them) and one those of 128 c + 64..127
// (the high nibbles, bits 4-5 and 6-7), each against its 64 activation bytes as they lie in
// memory. vpdpbusd's dwords (four products, at most 4 * 63 * 127) are multiplied by their group's
// scale (the low int16 of the scale's dword: signed, 0 above it) and added by vpdpwssd; the -32
// offset is taken off afterwards as in tile_q6k. Exact integers, tile_q6k's sums.
template <int R>
void tile_q6k_in_place(const ActRows& a, int64_t i0, const uint8_t* w, int64_t rb, int64_t nb, const float* bias,
                       float* y, int64_t ldy, const uint8_t* pf) {
  const int64_t nbx = a.k / kQKBlock;
  const __m512i low4 = _mm512_set1_epi8(15), low2 = _mm512_set1_epi8(3);
  __m512i pick[4];  // groups 4h + 0..3 of the super-block, each in 4 dwords
  for (int h = 0; h < 4; ++h)
    pick[h] = _mm512_setr_epi32(4 * h, 4 * h, 4 * h, 4 * h, 4 * h + 1, 4 * h + 1, 4 * h + 1, 4 * h + 1, 4 * h + 2,
                                4 * h + 2, 4 * h + 2, 4 * h + 2, 4 * h + 3, 4 * h + 3, 4 * h + 3, 4 * h + 3);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_share(pf, b, 8 * kQ6KBlockBytes);
    __m256i part[R][8];
    for (int n = 0; n < 8; ++n) {
      const uint8_t* blk = w + n * rb + b * kQ6KBlockBytes;
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ6KScalesAt));
      const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
      const __m512i sc = _mm512_cvtepu16_epi32(sc16);  // each int16 scale over a zero int16
      __m512i s[R];
      for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (int c = 0; c < 2; ++c) {
        const __m512i ql = _mm512_loadu_si512(blk + 64 * c);
        const __m256i qh = load256(blk + kQ6KHighAt + 32 * c);
        const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        const __m512i qh4 = _mm512_srli_epi16(qh2, 4);
        const __m512i q[2] = {
            _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_slli_epi16(_mm512_and_si512(qh2, low2), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                            _mm512_slli_epi16(_mm512_and_si512(qh4, low2), 4))};
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m512i scv = _mm512_permutexvar_epi32(pick[2 * c + h], sc);
          for (int r = 0; r < R; ++r) {
            const __m512i x = _mm512_loadu_si512(a.q + (i0 + r) * a.k + b * kQKBlock + 128 * c + 64 * h);
            s[r] = _mm512_dpwssd_epi32(s[r], _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[h], x), scv);
          }
        }
      }
      for (int r = 0; r < R; ++r) {  // the -32 offset: minus 32 * sum_g sc_g * sum(x over g)
        const __m256i xs = load256(a.s16 + (i0 + r) * (a.k / 16) + b * 16);
        part[r][n] = _mm256_sub_epi32(add_halves(s[r]), _mm256_slli_epi32(_mm256_madd_epi16(sc16, xs), 5));
      }
    }
    const __m256 d = f16x8(w + b * kQ6KBlockBytes + kQ6KDAt, rb);
    for (int r = 0; r < R; ++r) acc[r] = add_block(acc[r], d, a.d[(i0 + r) * nbx + b], reduce_outputs(part[r]));
  }
  for (int r = 0; r < R; ++r) store_outputs(acc[r], bias, y + (i0 + r) * ldy);
}

// Per 128-bit lane: u0 + u2, v0 + v2, u1 + u3, v1 + v3 (the dwords of W rows n and n + 1).
inline __m512i add_row_pairs(__m512i u, __m512i v) {
  return _mm512_add_epi32(_mm512_unpacklo_epi32(u, v), _mm512_unpackhi_epi32(u, v));
}
// Per 128-bit lane, from add_row_pairs of rows n, n + 1 (t) and n + 2, n + 3 (v): each row's 4
// dwords added, rows n..n + 3 in order.
inline __m512i add_row_quads(__m512i t, __m512i v) {
  return _mm512_add_epi32(_mm512_unpacklo_epi64(t, v), _mm512_unpackhi_epi64(t, v));
}
// Blocks j and j + 1 (the 256-bit halves of dwdx = d_w * d_x and s) ended as add_block ends them.
inline __m256 add_two_blocks(__m256 acc, __m512 dwdx, __m512i s) {
  const __m512 f = _mm512_cvtepi32_ps(s);
  acc = _mm256_fmadd_ps(_mm512_castps512_ps256(dwdx), _mm512_castps512_ps256(f), acc);
  return _mm256_fmadd_ps(high_ps(dwdx), high_ps(f), acc);
}

// Few rows (decode), W read in place, Q4_0, four blocks b..b + 3 of the 8 W rows at once. Per W
// row, two loads (at the first block and 8 bytes on) hold the 72 bytes; one vpermt2w puts the
// four blocks' 16 quant bytes in the four 128-bit lanes, and one masked vpermw moves the row's
// four f16 scales into sc, block-major (word 8 j + n: block b + j, W row n). The low nibbles
// (elements 0-15 of each block) and the high ones (16-31) meet the activations rearranged the
// same way, both in one vpdpbusd chain: 4 dwords per block per W row, then added across by
// unpacks (rows 0-3 and 4-7 each in one zmm, block j in lane j) and put in block order, two
// blocks per zmm. Each block then ends as add_block ends it: the same sums, the same fused
// multiply-adds in the same order.
template <int R>
inline void q4_0_four_blocks(const ActRows& a, int64_t i0, const uint8_t* w, int64_t rb, int64_t b, __m256* acc) {
  alignas(64) static constexpr int16_t kQuantWords[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12,
                                                          13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24,
                                                          25, 26, 56, 57, 58, 59, 60, 61, 62, 63};
  alignas(64) static constexpr int16_t kScaleWords[32] = {0,  0,  0,  0,  0,  0,  0,  0,  9,  9,  9,
                                                          9,  9,  9,  9,  9,  18, 18, 18, 18, 18, 18,
                                                          18, 18, 27, 27, 27, 27, 27, 27, 27, 27};
  const __m512i qidx = _mm512_load_si512(kQuantWords), sidx = _mm512_load_si512(kScaleWords);
  const __m512i low4 = _mm512_set1_epi8(15);
  const int64_t nbx = a.k / kQBlock;
  __m512i xlo[R], xhi[R];
  for (int r = 0; r < R; ++r) {
    const int8_t* xr = a.q + (i0 + r) * a.k + b * kQBlock;
    const __m512i x01 = _mm512_loadu_si512(xr), x23 = _mm512_loadu_si512(xr + 64);
    xlo[r] = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(2, 0, 2, 0));
    xhi[r] = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(3, 1, 3, 1));
  }
  __m512i sc = _mm512_setzero_si512();
  __m512i half[R][2], t[R][2];
  for (int n = 0; n < 8; n += 2) {
    __m512i s[R][2];
    for (int m = 0; m < 2; ++m) {
      const uint8_t* blk = w + (n + m) * rb + b * kQ4BlockBytes;
      const __m512i z0 = _mm512_loadu_si512(blk), z8 = _mm512_loadu_si512(blk + 8);
      const __m512i q = _mm512_permutex2var_epi16(z0, qidx, z8);
      sc = _mm512_mask_permutexvar_epi16(sc, 0x01010101u << (n + m), sidx, z0);
      const __m512i lo = _mm512_and_si512(q, low4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
      for (int r = 0; r < R; ++r)
        s[r][m] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo[r]), hi, xhi[r]);
    }
    for (int r = 0; r < R; ++r) t[r][(n / 2) & 1] = add_row_pairs(s[r][0], s[r][1]);
    if (n == 2 || n == 6)
      for (int r = 0; r < R; ++r) half[r][n / 4] = add_row_quads(t[r][0], t[r][1]);
  }
  // Blocks 0 and 1 (2 and 3) of rows 0-3 and 4-7 in order; each block's d_x and offset to 8 lanes.
  const __m512i blocks01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i blocks23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  const __m512i spread01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i spread23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m512 dw01 = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
  const __m512 dw23 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1));
  for (int r = 0; r < R; ++r) {
    const int64_t at = (i0 + r) * nbx + b;
    const __m512i off = _mm512_castsi128_si512(
        _mm_slli_epi32(_mm_cvtepi16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.s32 + at))), 3));
    const __m512 dx = _mm512_castps128_ps512(_mm_loadu_ps(a.d + at));
    const __m512i s01 = _mm512_permutex2var_epi64(half[r][0], blocks01, half[r][1]);
    const __m512i s23 = _mm512_permutex2var_epi64(half[r][0], blocks23, half[r][1]);
    acc[r] = add_two_blocks(acc[r], _mm512_mul_ps(dw01, _mm512_permutexvar_ps(spread01, dx)),
                            _mm512_sub_epi32(s01, _mm512_permutexvar_epi32(spread01, off)));
    acc[r] = add_two_blocks(acc[r], _mm512_mul_ps(dw23, _mm512_permutexvar_ps(spread23, dx)),
                            _mm512_sub_epi32(s23, _mm512_permutexvar_epi32(spread23, off)));
  }
}

// Few rows (decode), W read in place, Q4_0: R rows from i0 times the 8 W rows at w, four blocks
// at a time (q4_0_four_blocks), the rest two blocks per zmm. There the 32 quant bytes of blocks b
// and b + 1 become [low nibbles b | b + 1 | high nibbles b | b + 1] (16 each), against the
// activations of the two blocks with their middle 16-byte lanes swapped; vpdpbusd's dwords then
// hold four products each, the two 256-bit halves are added (lanes 0-3: block b, 4-7: b + 1),
// and one horizontal-add tree gives the 8 outputs' sums of each block. Exact integers, the sums
// of tile_q32; an odd last block goes through the same tree with b + 1's half empty.
template <int R>
void tile_q4_0_in_place(const ActRows& a, int64_t i0, const uint8_t* w, int64_t rb, int64_t nb, const float* bias,
                        float* y, int64_t ldy, const uint8_t* pf) {
  const int64_t nbx = a.k / kQBlock;
  const __m512i low4 = _mm512_set1_epi8(15);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    for (int64_t j = 0; j < 4; ++j) prefetch_share(pf, b + j, 8 * kQ4BlockBytes);
    q4_0_four_blocks<R>(a, i0, w, rb, b, acc);
  }
  for (; b < nb; b += 2) {
    const bool pair = b + 1 < nb;
    prefetch_share(pf, b, 8 * kQ4BlockBytes);
    if (pair) prefetch_share(pf, b + 1, 8 * kQ4BlockBytes);
    __m512i x[R];
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = a.q + (i0 + r) * a.k + b * kQBlock;
      const __m512i xv = pair ? _mm512_loadu_si512(xr) : _mm512_castsi256_si512(load256(xr));
      x[r] = _mm512_shuffle_i64x2(xv, xv, _MM_SHUFFLE(3, 1, 2, 0));
    }
    __m256i f[R][8];
    for (int n = 0; n < 8; ++n) {
      const uint8_t* blk = w + n * rb + b * kQ4BlockBytes;
      const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      const __m128i q1 = pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ4BlockBytes + 2))
                              : _mm_setzero_si128();
      const __m256i v = _mm256_set_m128i(q1, q0);
      const __m512i q = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), low4);
      for (int r = 0; r < R; ++r) {
        f[r][n] = add_halves(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x[r]));
      }
    }
    const __m256 dw0 = f16x8(w + b * kQ4BlockBytes, rb);
    const __m256 dw1 = pair ? f16x8(w + (b + 1) * kQ4BlockBytes, rb) : dw0;
    for (int r = 0; r < R; ++r) {
      // [outputs 0-3 of b | 0-3 of b + 1], then outputs 4-7.
      const __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(f[r][0], f[r][1]), _mm256_hadd_epi32(f[r][2], f[r][3]));
      const __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(f[r][4], f[r][5]), _mm256_hadd_epi32(f[r][6], f[r][7]));
      const int64_t at = (i0 + r) * nbx + b;
      const __m256i s0 = _mm256_sub_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_set1_epi32(8 * a.s32[at]));
      acc[r] = add_block(acc[r], dw0, a.d[at], s0);
      if (pair) {
        const __m256i s1 =
            _mm256_sub_epi32(_mm256_permute2x128_si256(lo, hi, 0x31), _mm256_set1_epi32(8 * a.s32[at + 1]));
        acc[r] = add_block(acc[r], dw1, a.d[at + 1], s1);
      }
    }
  }
  for (int r = 0; r < R; ++r) store_outputs(acc[r], bias, y + (i0 + r) * ldy);
}
#endif

#if defined(ASTRAI_ISA_V3)
// The few-row tiles with AVX-VNNI (linear_int8_tiles.inc): vpdpbusd sums four products per dword,
// vpdpwssd multiplies each dword (at most 4 * 63 * 127: it fits in its low int16) by the scale
// in the low int16 of the other operand's dword (0 above it) and adds.
inline __m256i dot4(__m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s); }
inline __m256i scale_words(__m256i s32) { return _mm256_and_si256(s32, _mm256_set1_epi32(0xffff)); }
inline __m256i add_scaled(__m256i acc, __m256i u, __m256i s, __m256i sc) {
  return _mm256_dpwssd_avx_epi32(acc, dot4(u, s), sc);
}
#include "kernels/cpu/linear_int8_tiles.inc"
#endif

}  // namespace vnni
ASTRAI_PRAGMA(GCC pop_options)

constexpr int kStepTileRows = 6;

// fn(std::integral_constant<int, r>{}) for a row count r in [1, kMax].
template <int kMax, typename Fn>
inline void with_rows(int64_t r, Fn&& fn) {
  if constexpr (kMax > 1) {
    if (r == kMax) return fn(std::integral_constant<int, kMax>{});
    with_rows<kMax - 1>(r, fn);
  } else {
    fn(std::integral_constant<int, 1>{});
  }
}

// Rows [i0, i1) of x times the 8 G W rows at w (G groups of 8) through the interleaved copy (Q4_0,
// Q4_K, Q5_K, Q6_K; Q8_0 with VNNI only), with the VNNI tiles or without (v4's VNNI tiles on pairs
// of steps; G > 1 only with them). pf: the next pf_rows W rows (or null), prefetched meanwhile.
// Out of line: inlined into outputs<T> (once interleave_q4_k was not), v4's tiles without VNNI
// ran 15-20% slower on Q4_K at 32 and 512 rows.
template <DType T, bool Vnni, int G>
[[gnu::noinline]] void outputs_steps(const ActRows& a, int64_t i0, int64_t i1, const uint8_t* w, int64_t nb,
                                     const float* bias, float* y, int64_t ldy, const uint8_t* pf, int64_t pf_rows) {
  constexpr bool k4 = T == DType::kQ4_K || T == DType::kQ5_K, k6 = T == DType::kQ6_K, q8 = T == DType::kQ8_0;
#if defined(ASTRAI_ISA_V4)
  constexpr bool kPairs = Vnni;
#else
  constexpr bool kPairs = false;
#endif
  static_assert(Vnni || !q8, "Q8_0 steps need VNNI (maddubs would saturate)");
  static_assert(G == 1 || kPairs, "groups at once: v4's VNNI tiles only");
  const int64_t rb = nb * block_bytes(T);
  const int64_t step_bytes =
      nb * (k4 ? kQ4KSteps : k6 ? kQ6KSteps : Vnni && signed_steps(T) ? kQ8StepBlock : kBlockSteps * kStepBytes);
  thread_local std::vector<uint8_t> steps;  // grown, never shrunk
  thread_local std::vector<float> scales;
  if (steps.size() < static_cast<size_t>(G * step_bytes)) steps.resize(static_cast<size_t>(G * step_bytes));
  if (scales.size() < static_cast<size_t>(G * nb * 16)) scales.resize(static_cast<size_t>(G * nb * 16));
  const uint8_t* st[G];
  const float* sc[G];
  for (int g = 0; g < G; ++g) {
    uint8_t* out = steps.data() + g * step_bytes;
    float* out_scales = scales.data() + g * nb * 16;
    const uint8_t* wg = w + 8 * g * rb;
    if constexpr (k4) interleave_q4_k<T, kPairs>(wg, rb, nb, out, out_scales);
    else if constexpr (k6) interleave_q6_k<kPairs>(wg, rb, nb, out, out_scales);
    else if constexpr (q8) interleave_q8_0<kPairs>(wg, rb, nb, out, out_scales);
    else interleave_q4_0<kPairs>(wg, rb, nb, out, out_scales);
    st[g] = out;
    sc[g] = out_scales;
  }
  // The next rows (pf, or null) into L2 while these tiles run: their rewrite then reads from
  // cache, not memory (the weights of a decode step are far larger than the caches). Up to 32
  // rows (decode batches), a share before each tile: one burst of requests stalls on the cache's
  // miss queue (32 sequences: 4-10% slower). More rows (prefill), one burst before the first
  // tile: shares spread over them came too late for the rewrite that follows (4-9% slower).
  const int64_t pf_bytes = pf ? pf_rows * rb : 0;
  const auto run = [&](auto rows, int64_t i) {
    constexpr int kR = decltype(rows)::value;
    if constexpr (Vnni && k4) vnni::tile_q4_k_steps<T, G, kR>(a, i, st, sc, nb, bias, y, ldy);
    else if constexpr (Vnni && k6) vnni::tile_q6_k_steps<G, kR>(a, i, st, sc, nb, bias, y, ldy);
    else if constexpr (Vnni) vnni::tile_q32_steps<T, G, kR>(a, i, st, sc, nb, bias, y, ldy);
    else if constexpr (k4) tile_q4_k_steps<T, kR>(a, i, st[0], sc[0], nb, bias, y, ldy);
    else if constexpr (k6) tile_q6_k_steps<kR>(a, i, st[0], sc[0], nb, bias, y, ldy);
    else tile_q4_0_steps<kR>(a, i, st[0], sc[0], nb, bias, y, ldy);
  };
  // Rows per tile: what the registers hold (16 ymm: 4 for the k-quants; 32 zmm: 8 by one group,
  // 4 by two or three).
  constexpr int kMax = G >= 2 ? 4 : kPairs ? 8 : k4 || k6 ? 4 : kStepTileRows;
  constexpr int64_t kSpreadTiles = G >= 2 ? 8 : 4;  // tiles of a 32-row decode batch
  const int64_t tiles = (i1 - i0 + kMax - 1) / kMax, shares = tiles <= kSpreadTiles ? tiles : 1;
  for (int64_t i = i0, t = 0; i < i1; ++t) {
    if (t < shares)
      for (int64_t off = pf_bytes * t / shares / 64 * 64; off < pf_bytes * (t + 1) / shares; off += 64)
        prefetch_l2(pf + off);
    const int64_t r = std::min<int64_t>(kMax, i1 - i);
    with_rows<kMax>(r, [&](auto rows) { run(rows, i); });
    i += r;
  }
}

// Rows [i0, i1) of x times the nr W rows at w: a partial group (nr < 8), one group (8), or two or
// three (16, 24: where groups_at_once says); the tiles prefetch the next pf_rows W rows at pf (or
// none) into L2.
template <DType T>
void outputs(const ActRows& a, int64_t i0, int64_t i1, const uint8_t* w, int64_t nr, int64_t nb, const float* bias,
             float* y, int64_t ldy, const uint8_t* pf, int64_t pf_rows) {
  if (nr < 8) return outputs_ref<T>(a, i0, i1 - i0, w, nr, nb, bias, y, ldy);
#if defined(ASTRAI_ISA_V4)
  if constexpr (groups_together(T)) {
    if (nr == 16) return outputs_steps<T, true, 2>(a, i0, i1, w, nb, bias, y, ldy, pf, pf_rows);
    if (nr == 24) return outputs_steps<T, true, 3>(a, i0, i1, w, nb, bias, y, ldy, pf, pf_rows);
  }
#endif
  ASTRAI_CHECK(nr == 8, "linear_int8: groups of 8 W rows, or up to three where groups_at_once says");
  // Rewriting a group pays off past 1 tile of rows (Q8_0 on v4: past 3 rows; Q8_0 only with
  // VNNI). The k-quants had waited for 2 tiles (Q6_K without VNNI for 8) when their scales took
  // longer to rewrite; since the groups' rewrite, on a Zen 5 as v3, one thread, two alternating
  // rounds, interleaving is 1.15-1.45x the in-place tiles at 5 and 6 rows and 1.1-1.6x at 8,
  // with AVX-VNNI or without, and Q6_K without VNNI 1.7-1.85x at 16 and 32 rows. v3's VNNI
  // k-quant tiles (two chains of 4 rows in 16 ymm registers) spill a little; Q6_K's (once 0.6x
  // at 512 rows, before that rewrite) are 1.55x the in-place tiles at 32 rows and 1.0-1.17x the
  // plain interleaved ones at 512 (3 rows per tile measured no better). gemm_bench's quantized
  // table measures these.
  const bool vnni = a.vnni;
  const int64_t from = vnni ? vnni_steps_from(T) : kTileRows;
  if (i1 - i0 > from) {
    if (vnni) return outputs_steps<T, true, 1>(a, i0, i1, w, nb, bias, y, ldy, pf, pf_rows);
    if constexpr (T != DType::kQ8_0) return outputs_steps<T, false, 1>(a, i0, i1, w, nb, bias, y, ldy, pf, pf_rows);
  }
  // Few rows: W read in place, tiles of up to 4 rows (with VNNI: v4's zmm tiles but for Q8_0,
  // v3's tiles with AVX-VNNI for the k-quants).
  const int64_t rb = nb * block_bytes(T);
  for (int64_t i = i0; i < i1;) {
    const int64_t r = std::min<int64_t>(kTileRows, i1 - i);
    const uint8_t* p = i == i0 ? pf : nullptr;
    with_rows<kTileRows>(r, [&](auto rows) {
      constexpr int kR = decltype(rows)::value;
#if defined(ASTRAI_ISA_V4)
      if constexpr (T != DType::kQ8_0) {
        if (a.vnni) {
          if constexpr (T == DType::kQ4_0) vnni::tile_q4_0_in_place<kR>(a, i, w, rb, nb, bias, y, ldy, p);
          else if constexpr (T == DType::kQ6_K) vnni::tile_q6k_in_place<kR>(a, i, w, rb, nb, bias, y, ldy, p);
          else vnni::tile_q4k_in_place<T, kR>(a, i, w, rb, nb, bias, y, ldy, p);
          return;
        }
      }
#else
      // v3: the k-quants' tiles with AVX-VNNI (Zen 5 as v3, one thread, 3-4 rows: +10-35%; Q8_0
      // and Q4_0 measured level, so they keep maddubs).
      if constexpr (is_k_quant(T))
        if (a.vnni) return vnni::tile<T, kR>(a, i, w, rb, nb, bias, y, ldy, p);
#endif
      tile<T, kR>(a, i, w, rb, nb, bias, y, ldy, p);
    });
    i += r;
  }
}

#elif defined(ASTRAI_ISA_NEON)

// sdot where the CPU has the dot product extension ("asimddp") and ASTRAI_CPU_VNNI allows it.
bool use_vnni() {
  static const bool has = cpu_has(vnni_feature(Isa::kNeon));
  return has && vnni_allowed();
}

template <DType T>
void outputs(const ActRows& a, int64_t i0, int64_t i1, const uint8_t* w, int64_t nr, int64_t nb, const float* bias,
             float* y, int64_t ldy, const uint8_t*, int64_t) {
  if (a.vnni) sdot::outputs_ref<T>(a, i0, i1 - i0, w, nr, nb, bias, y, ldy);
  else widen::outputs_ref<T>(a, i0, i1 - i0, w, nr, nb, bias, y, ldy);
}

#else

bool use_vnni() { return false; }

template <DType T>
void outputs(const ActRows& a, int64_t i0, int64_t i1, const uint8_t* w, int64_t nr, int64_t nb, const float* bias,
             float* y, int64_t ldy, const uint8_t*, int64_t) {
  outputs_ref<T>(a, i0, i1 - i0, w, nr, nb, bias, y, ldy);
}

#endif

#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
constexpr bool kUnsignedQ8 = true;
#else
constexpr bool kUnsignedQ8 = false;
#endif
constexpr int64_t kOutGroup = 8;   // outputs per tile
constexpr int64_t kRowBlock = 64;  // rows of x per pass over a thread's W rows (their q stay in L2)
constexpr int64_t kMaxGroup = 8;   // matrices per parallel job (linear_int8_group)

// nr output rows (a group of 8 W rows, fewer, or two groups) of one matrix: the tile loop of
// outputs<T> for its dtype, the next_rows W rows at next prefetched meanwhile.
void outputs_of(DType t, const ActRows& a, int64_t i0, int64_t i1, const uint8_t* w, int64_t nr, int64_t nb,
                const float* bias, float* y, int64_t ldy, const uint8_t* next, int64_t next_rows) {
  switch (t) {
    case DType::kQ8_0: return outputs<DType::kQ8_0>(a, i0, i1, w, nr, nb, bias, y, ldy, next, next_rows);
    case DType::kQ4_0: return outputs<DType::kQ4_0>(a, i0, i1, w, nr, nb, bias, y, ldy, next, next_rows);
    case DType::kQ4_K: return outputs<DType::kQ4_K>(a, i0, i1, w, nr, nb, bias, y, ldy, next, next_rows);
    case DType::kQ5_K: return outputs<DType::kQ5_K>(a, i0, i1, w, nr, nb, bias, y, ldy, next, next_rows);
    case DType::kQ6_K: return outputs<DType::kQ6_K>(a, i0, i1, w, nr, nb, bias, y, ldy, next, next_rows);
    default: fail("linear_int8: not a quantized weight type: ", dtype_name(t));
  }
}

// One parallel job over the outputs of every matrix of the group: x quantized once (all
// threads), then the matrices' groups of 8 outputs laid end to end and split evenly over the
// threads, each group computed as a lone matrix's would be (the same bits). A thread's next
// group is prefetched into L2 during the one before, also across a matrix boundary when the two
// matrices have the same type.
void run_group(const float* x, int64_t m, const LinearOut* outs, int64_t n) {
  const int64_t k = outs[0].w.cols, block = block_elems(outs[0].w.dtype);
  bool unsigned_q = false;  // some matrix takes its VNNI steps against x as unsigned bytes
  std::array<int64_t, kMaxGroup + 1> first{};  // first[o]: the group index of out o's first group
  for (int64_t o = 0; o < n; ++o) {
    const WeightView& w = outs[o].w;
    ASTRAI_CHECK(is_block_type(w.dtype), "linear_int8: not a quantized weight type: ", dtype_name(w.dtype));
    ASTRAI_CHECK(w.cols == k && block_elems(w.dtype) == block,
                 "linear_int8_group: every matrix needs the same cols and block size");
    unsigned_q = unsigned_q || (signed_steps(w.dtype) && m > vnni_steps_from(w.dtype));
    first[static_cast<size_t>(o + 1)] = first[static_cast<size_t>(o)] + (w.rows + kOutGroup - 1) / kOutGroup;
  }
  // The quantized rows: one buffer per calling thread, grown, never shrunk.
  thread_local std::vector<int64_t> storage;
  const size_t q_bytes = static_cast<size_t>(m * k), d_bytes = static_cast<size_t>(m * (k / block)) * 4;
  const size_t s16_bytes = static_cast<size_t>(m * (k / 16)) * 2, s32_bytes = static_cast<size_t>(m * (k / 32)) * 2;
  const bool vnni = use_vnni();
  unsigned_q = unsigned_q && kUnsignedQ8 && vnni;
  const size_t total = q_bytes * (unsigned_q ? 2 : 1) + d_bytes + s16_bytes + s32_bytes + 64;
  if (storage.size() * 8 < total) storage.resize(total / 8 + 1);
  uint8_t* base = reinterpret_cast<uint8_t*>(storage.data());
  float* d = reinterpret_cast<float*>(base);
  int16_t* s16 = reinterpret_cast<int16_t*>(base + d_bytes);
  int16_t* s32 = reinterpret_cast<int16_t*>(base + d_bytes + s16_bytes);
  int8_t* q = reinterpret_cast<int8_t*>(base + d_bytes + s16_bytes + s32_bytes);
  uint8_t* qu = unsigned_q ? reinterpret_cast<uint8_t*>(q + q_bytes) : nullptr;
  const ActRows a{q, vnni, qu, d, s16, s32, k, block};
  const int64_t groups = first[static_cast<size_t>(n)];
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      quantize_row(x + i * k, k, block, q + i * k, d + i * (k / block), s16 + i * (k / 16), s32 + i * (k / 32));
      if (qu)
        for (int64_t e = 0; e < k; ++e) qu[i * k + e] = static_cast<uint8_t>(q[i * k + e] ^ 0x80);
    }
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t g0 = groups * t / nt, g1 = groups * (t + 1) / nt;
    for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
      const int64_t i1 = std::min(m, i0 + kRowBlock);
      for (int64_t g = g0, o = 0; g < g1;) {
        while (g >= first[static_cast<size_t>(o + 1)]) ++o;  // the matrix of group g
        const WeightView& w = outs[o].w;
        const int64_t nb = k / block_elems(w.dtype), rb = nb * block_bytes(w.dtype);
        const uint8_t* wb = static_cast<const uint8_t*>(w.data);
        const int64_t j = (g - first[static_cast<size_t>(o)]) * kOutGroup;
        // This group alone, or with the next ones of this matrix (as many as groups_at_once
        // allows, each whole and this thread's).
        int64_t span = groups_at_once(w.dtype, i1 - i0, vnni);
        while (span > 1 && (g + span > g1 || w.rows - j < span * kOutGroup)) --span;
        const int64_t nr = std::min(span * kOutGroup, w.rows - j);
        // The next rows as many as these: this matrix's if a whole group, else the next matrix's
        // first if it is whole and of this type (the prefetch takes this type's block bytes).
        const uint8_t* next = nullptr;
        int64_t next_rows = 0;
        if (g + span < g1) {
          if (w.rows - j >= nr + kOutGroup) {
            next = wb + (j + nr) * rb;
            next_rows = std::min(nr, w.rows - j - nr);
          } else if (g + span == first[static_cast<size_t>(o + 1)] && outs[o + 1].w.dtype == w.dtype &&
                     outs[o + 1].w.rows >= kOutGroup) {
            next = static_cast<const uint8_t*>(outs[o + 1].w.data);
            next_rows = std::min(nr, outs[o + 1].w.rows);
          }
        }
        const float* bias = outs[o].bias;
        outputs_of(w.dtype, a, i0, i1, wb + j * rb, nr, nb, bias ? bias + j : nullptr, outs[o].y + j, w.rows, next,
                   next_rows);
        g += span;
      }
    }
  }
}

}  // namespace

void linear_int8(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  const LinearOut out{w, bias, y};
  run_group(x, m, &out, 1);
}

void linear_int8_group(const float* x, int64_t m, const LinearOut* outs, int64_t n) {
  for (int64_t o0 = 0; o0 < n; o0 += kMaxGroup) run_group(x, m, outs + o0, std::min<int64_t>(kMaxGroup, n - o0));
}

ASTRAI_KERNELS_END
