// Register tiles of the linear kernel (matmul.cc) for the SIMD levels, written once over Vec16
// with a shape per level. A tile computes MR rows of x against NR rows of W over one K block
// (kc <= kKb) and adds the block's contribution to y in the contract's order (matmul.cc): one
// Vec16 accumulator per output, one fused multiply-add per 16-wide step, the K tail
// zero-padded, the 16 lanes summed by the fixed tree. Tiling only decides which outputs share
// loads; the operations per output are the same in every tile, on every level.
//
// Shapes (accumulators must stay in registers):
//   v4   (32 zmm): groups of 8 W rows; tiles 1-3 rows of x x 8 W rows (24 accumulators + 3 x
//        + 1 W), the 8 sums of a row reduced together (reduce8).
//   v3   (16 ymm, a Vec16 is two): groups of 8 W rows; tiles of 1-3 rows x 4 W rows. Lanes
//        0-7 and 8-15 of an accumulator are independent chains, so a 2- or 3-row tile runs K in
//        passes of kPassK, one part (8 lanes) at a time: only that part of each accumulator (up
//        to 12 ymm), the x parts and one W part are in registers, the other part waits in
//        memory. A 1-row tile (decode) holds all 8 in registers and streams W step by step
//        (1 x 8 in passes: batch-1 decode 70-76 -> 83-86 tokens/s). Decode of one row with
//        f32, bf16 or f16 W skips the tiles on v3 and v4 (matmul.cc, gemv_rows).
//   neon (32 q, a Vec16 is four 4-lane parts): as v3.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/level.h"
#include "kernels/cpu/reduce8.h"
#include "kernels/cpu/simd.h"
#include "tensor/dtype.h"

ASTRAI_KERNELS_BEGIN

#if defined(ASTRAI_ISA_V4)
constexpr int kGroup = 8;    // W rows per group: the unit of threading, packing and prefetching
constexpr int kMaxRows = 3;  // x rows per tile
constexpr int sub_rows(int64_t) { return 8; }  // W rows per tile, by the tile's x rows
#else
constexpr int kGroup = 8;
constexpr int kMaxRows = 3;
constexpr int sub_rows(int64_t) { return 4; }
#endif
// K block of the reduction order (matmul.cc), the same for every shape and level. Each block
// ends in a lane reduction; 1024 instead of 256 made that 4x rarer: +5-18% at M = 32-512 (v4).
constexpr int64_t kKb = 1024;
static_assert(kKb % kQKBlock == 0, "a K block holds whole k-quant super-blocks");
// The many-rows order of linear() (matmul.cc, W packed per block) and linear_bf16_dot (W in
// place): W rows in blocks of kBlockRows (v4: 128 x 1024 x 4 B = 512 KiB packed), under each the
// K blocks of kKb in order, under each the rows of x in blocks of kRowBlock. So a W block is
// packed once per K block whatever M is (with the rows of x outside the K blocks it was packed,
// read from memory, once per kRowBlock rows: 3 times at 512 rows, 11 at 2048); the partial
// sums y[rows, kBlockRows cols] are reread once per K block, where there are several.
constexpr int64_t kBlockRows = 16 * kGroup;
constexpr int64_t kRowBlock = 192;  // a multiple of 2 and 3 (the row tiles)
// fn(nb0, nb1, mb0, mb1, k0, kc) for W rows [r0, r1), m rows of x and K = kk in that order.
template <typename Fn>
inline void for_each_block(int64_t r0, int64_t r1, int64_t m, int64_t kk, Fn&& fn) {
  for (int64_t nb0 = r0; nb0 < r1; nb0 += kBlockRows)
    for (int64_t k0 = 0; k0 < kk; k0 += kKb)
      for (int64_t mb0 = 0; mb0 < m; mb0 += kRowBlock)
        fn(nb0, std::min(r1, nb0 + kBlockRows), mb0, std::min(m, mb0 + kRowBlock), k0, std::min(kKb, kk - k0));
}
constexpr int64_t kPassK = 256;  // K per pass of one part (levels with several parts)
// Accumulator registers a tile may hold at once (the rest of the register file holds x and W).
#if defined(ASTRAI_ISA_NEON)
constexpr int kAccRegs = 24;
#else
constexpr int kAccRegs = 12;
#endif

// Rows of the next tile when `rem` rows of x are left. v4: 3s, a 1-row remainder turned into two
// 2-row tiles (a 1-row tile loads a W vector per 8 FMAs); others: 2s and a last 1. Values never
// depend on it.
inline int64_t tile_rows(int64_t rem) {
  return rem >= 4 && rem % 3 == 1 ? 2 : std::min<int64_t>(3, rem);
}

inline int64_t num_tiles(int64_t m) {
  int64_t n = 0;
  for (int64_t i = 0; i < m; i += tile_rows(m - i)) ++n;
  return n;
}

// Bytes of one element of a float weight type (the block types are addressed by row_bytes and
// load_w_at).
template <DType T>
constexpr int64_t kElemBytes = T == DType::kF32 ? 4 : 2;

// Q8_0, Q4_0 (blocks of 32), Q4_K, Q5_K and Q6_K (super-blocks of 256) (tensor/dtype.h): rows of
// whole blocks, no K tails.
template <DType T>
constexpr bool kBlockType = is_block_type(T);

// Bytes of the first k elements of a W row (k a multiple of the block for the block types).
template <DType T>
constexpr int64_t row_bytes(int64_t k) {
  if constexpr (kBlockType<T>) return k / block_elems(T) * block_bytes(T);
  else return k * kElemBytes<T>;
}

// The 6-bit sub-block scales and mins of a Q4_K (or Q5_K: the same first 16 bytes) block at b,
// unpacked 4 at a time from the 12 scale bytes as 32-bit little-endian words (q4_k_scale_min
// gives the same values one at a time).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "q4k_six_bit reads little-endian words");
struct Q4kSixBit {
  uint32_t w[4];  // bytes sc[0..3], sc[4..7], m[0..3], m[4..7]
};
inline Q4kSixBit q4k_six_bit(const uint8_t* b) {
  uint32_t w[3];
  std::memcpy(w, b + kQ4KScalesAt, 12);
  return Q4kSixBit{{w[0] & 0x3f3f3f3fu, (w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u), w[1] & 0x3f3f3f3fu,
                    ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u)}};
}

// The block's sub-block multipliers: d * sc[j] in dm[j] and dmin * m[j] in dm[8 + j] (j < 8);
// exact products (an f16 times a 6-bit integer), widened and scaled 16 lanes at once.
inline void q4k_multipliers(const uint8_t* b, float* dm) {
  uint16_t dh, mh;
  std::memcpy(&dh, b, 2);
  std::memcpy(&mh, b + 2, 2);
  uint8_t bytes[16];
  std::memcpy(bytes, q4k_six_bit(b).w, 16);
  widen_u8_scaled(bytes, f16_scalar(dh), f16_scalar(mh), dm);
}

// The 16 quant bytes of Q4_K elements off..off+15 (off a multiple of 16 below 256) and the shift
// of their nibbles: 64 elements per 32 bytes, the first 32 in the low nibbles.
inline const uint8_t* q4k_quants(const uint8_t* b, int64_t off) { return b + kQ4KQuantsAt + off / 64 * 32 + off % 32; }
inline int q4k_shift(int64_t off) { return static_cast<int>(off / 32 % 2) * 4; }

// Sub-block j's multipliers d * sc[j] and dmin * m[j] of the Q4_K / Q5_K block at b.
inline void k_sub_multipliers(const uint8_t* b, int j, float* d1, float* m1) {
  uint16_t dh, mh;
  std::memcpy(&dh, b, 2);
  std::memcpy(&mh, b + 2, 2);
  int sc, m;
  q4_k_scale_min(b + kQ4KScalesAt, j, &sc, &m);
  *d1 = f16_scalar(dh) * static_cast<float>(sc);
  *m1 = f16_scalar(mh) * static_cast<float>(m);
}

// Q5_K: the 256 quants (0..31) of the block at b in element order (q5_k_quant in tensor/dtype.h).
// Integer work only; written a 32-byte column at a time so it vectorises.
inline void q5k_unpack(const uint8_t* b, uint8_t* q) {
  const uint8_t* qh = b + kQ5KHighAt;
  for (int c = 0; c < 4; ++c) {
    const uint8_t* qs = b + kQ5KQuantsAt + 32 * c;
    uint8_t* o = q + 64 * c;
#pragma GCC ivdep
    for (int i = 0; i < 32; ++i) {
      o[i] = static_cast<uint8_t>((qs[i] & 15) | (((qh[i] >> (2 * c)) & 1) << 4));
      o[32 + i] = static_cast<uint8_t>((qs[i] >> 4) | (((qh[i] >> (2 * c + 1)) & 1) << 4));
    }
  }
}

// Q5_K elements off..off+15 (off a multiple of 16) of the block at b: their quants into q, their
// sub-block's multipliers d * sc and dmin * m into *d1 and *m1.
inline void q5k_step(const uint8_t* b, int64_t off, uint8_t* q, float* d1, float* m1) {
  const int c = static_cast<int>(off / 64), t = static_cast<int>(off % 64 / 32), i0 = static_cast<int>(off % 32);
  const uint8_t* qs = b + kQ5KQuantsAt + 32 * c + i0;
  const uint8_t* qh = b + kQ5KHighAt + i0;
  for (int i = 0; i < 16; ++i) q[i] = static_cast<uint8_t>(((qs[i] >> (4 * t)) & 15) | (((qh[i] >> (2 * c + t)) & 1) << 4));
  k_sub_multipliers(b, static_cast<int>(off / 32), d1, m1);
}

// Q6_K: the 16 sub-block multipliers scale * d of the block at b (exact: an f16 times an
// int8), as one vector.
inline void q6k_multipliers(const uint8_t* b, float* dm) {
  uint16_t dh;
  std::memcpy(&dh, b + kQ6KDAt, 2);
  const float d = f16_scalar(dh);
  Vec16 v;
#pragma GCC unroll 4
  for (int h = 0; h < kParts; ++h) part(v, h) = pload_i8(reinterpret_cast<const int8_t*>(b + kQ6KScalesAt), d, h);
  vstore(dm, v);
}

// Q6_K: the 256 quants of the block at b as q - 32 (int8, element order). Integer work only (the
// same bytes however it is compiled); written a 32-byte column at a time so it vectorises.
inline void q6k_unpack(const uint8_t* b, int8_t* q) {
  for (int c = 0; c < 2; ++c) {
    const uint8_t* ql = b + 64 * c;
    const uint8_t* qh = b + kQ6KHighAt + 32 * c;
    int8_t* o = q + 128 * c;
#pragma GCC ivdep
    for (int i = 0; i < 32; ++i) {
      const uint8_t l0 = ql[i], l1 = ql[32 + i], h = qh[i];
      o[i] = static_cast<int8_t>(((l0 & 15) | ((h & 3) << 4)) - 32);
      o[32 + i] = static_cast<int8_t>(((l1 & 15) | ((h & 12) << 2)) - 32);
      o[64 + i] = static_cast<int8_t>(((l0 >> 4) | (h & 48)) - 32);
      o[96 + i] = static_cast<int8_t>(((l1 >> 4) | ((h >> 2) & 48)) - 32);
    }
  }
}

// Q6_K elements off..off+15 (off a multiple of 16) of the block at b: their quants - 32 into q,
// their sub-block's multiplier d * scale returned. The 16 share their bytes' rows and shifts
// (q6_k_quant in tensor/dtype.h): 16 consecutive bytes of ql and of qh.
inline float q6k_step(const uint8_t* b, int64_t off, int8_t* q) {
  const int c = static_cast<int>(off / 128), t = static_cast<int>(off % 128 / 32), i0 = static_cast<int>(off % 32);
  const uint8_t* ql = b + 64 * c + 32 * (t % 2) + i0;
  const uint8_t* qh = b + kQ6KHighAt + 32 * c + i0;
  const int ls = 4 * (t / 2), hs = 2 * t;
  for (int i = 0; i < 16; ++i) q[i] = static_cast<int8_t>((((ql[i] >> ls) & 15) | (((qh[i] >> hs) & 3) << 4)) - 32);
  uint16_t dh;
  std::memcpy(&dh, b + kQ6KDAt, 2);
  return f16_scalar(dh) * static_cast<float>(static_cast<int8_t>(b[kQ6KScalesAt + off / 16]));
}

// Part h of the 16 weights at element offset `off` (a multiple of 16) of the block at b, as f32
// (exact for Q8_0, Q4_0 and Q6_K; Q4_K and Q5_K: one rounding, the same on every level).
template <DType T>
inline Part pload_block(const uint8_t* b, int64_t off, int h) {
  if constexpr (T == DType::kQ8_0) {
    return pload_q8(b, off, h);
  } else if constexpr (T == DType::kQ4_0) {
    return pload_q4(b, off, h);
  } else if constexpr (T == DType::kQ6_K) {
    int8_t q[16];
    return pload_i8(q, q6k_step(b, off, q), h);
  } else if constexpr (T == DType::kQ5_K) {
    uint8_t q[16];
    float d1, m1;
    q5k_step(b, off, q, &d1, &m1);
    return pload_u8(q, d1, m1, h);
  } else {
    float d1, m1;
    k_sub_multipliers(b, static_cast<int>(off / 32), &d1, &m1);
    return pload_q4k(q4k_quants(b, off), q4k_shift(off), d1, m1, h);
  }
}

// 16 elements of a W row at p as f32 (bf16 and f16 widened exactly); the _n form: the first n,
// the others zero.
template <DType T>
inline Vec16 load_w(const uint8_t* p) {
  if constexpr (T == DType::kF32) return vload(reinterpret_cast<const float*>(p));
  else if constexpr (T == DType::kBF16) return vload_bf16(reinterpret_cast<const uint16_t*>(p));
  else return vload_f16(reinterpret_cast<const uint16_t*>(p));
}
template <DType T>
inline Vec16 load_w(const uint8_t* p, int64_t n) {
  if constexpr (T == DType::kF32) return vload(reinterpret_cast<const float*>(p), n);
  else if constexpr (T == DType::kBF16) return vload_bf16(reinterpret_cast<const uint16_t*>(p), n);
  else return vload_f16(reinterpret_cast<const uint16_t*>(p), n);
}

// The 16 elements k..k+15 of the W row at `row` (k a multiple of 16) as f32: exact for every
// type (a block type: the quants of k's block times its f16 scale).
template <DType T>
inline Vec16 load_w_at(const uint8_t* row, int64_t k) {
  if constexpr (kBlockType<T>) {
    constexpr int64_t be = block_elems(T);
    const uint8_t* block = row + row_bytes<T>(k / be * be);
    Vec16 v;
    if constexpr (T == DType::kQ6_K) {  // the 16 quants decoded once for all parts
      int8_t q[16];
      const float d1 = q6k_step(block, k % be, q);
#pragma GCC unroll 4
      for (int h = 0; h < kParts; ++h) part(v, h) = pload_i8(q, d1, h);
    } else if constexpr (T == DType::kQ5_K) {
      uint8_t q[16];
      float d1, m1;
      q5k_step(block, k % be, q, &d1, &m1);
#pragma GCC unroll 4
      for (int h = 0; h < kParts; ++h) part(v, h) = pload_u8(q, d1, m1, h);
    } else {
#pragma GCC unroll 4
      for (int h = 0; h < kParts; ++h) part(v, h) = pload_block<T>(block, k % be, h);
    }
    return v;
  } else {
    return load_w<T>(row + k * kElemBytes<T>);
  }
}

template <DType T>
inline Part pload_w(const uint8_t* p, int h) {
  if constexpr (T == DType::kF32) return pload(reinterpret_cast<const float*>(p), h);
  else if constexpr (T == DType::kBF16) return pload_bf16(reinterpret_cast<const uint16_t*>(p), h);
  else return pload_f16(reinterpret_cast<const uint16_t*>(p), h);
}

// One full 16-wide K step of a tile: acc[r][c] += x[r] . W row c over the step, a part at a
// time. x[r] is x + r * ldx; wpart(c, h) gives part h of W row c's 16 elements. Each W part is
// kept in a register for the MR FMAs that use it.
template <int MR, int NR, typename WPart>
[[gnu::always_inline]] inline void tile_step(const float* x, int64_t ldx, WPart&& wpart, Vec16 (&acc)[MR][NR]) {
#pragma GCC unroll 4
  for (int h = 0; h < kParts; ++h) {
    Part xv[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xv[r] = pload(x + r * ldx, h);
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) {
      Part wv = wpart(c, h);
      ppin(wv);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) part(acc[r][c], h) = pfma(xv[r], wv, part(acc[r][c], h));
    }
  }
}

// The full 16-wide steps [0, kfull) of a tile; wpart(c, k, h) gives part h of W row c's 16
// elements at k. One part: step by step. Several: in passes of kPassK per part, each pass's
// part of the accumulators in registers (every lane still accumulates its k in increasing order).
template <int MR, int NR, typename WPart>
[[gnu::always_inline]] inline void tile_steps(const float* x, int64_t ldx, int64_t kfull, WPart&& wpart,
                                              Vec16 (&acc)[MR][NR]) {
  if constexpr (kParts == 1 || MR * NR * kParts <= kAccRegs) {  // every part in registers at once
    for (int64_t k = 0; k < kfull; k += 16)
      tile_step<MR, NR>(x + k, ldx, [&](int c, int h) { return wpart(c, k, h); }, acc);
  } else {
    for (int64_t k0 = 0; k0 < kfull; k0 += kPassK) {
      const int64_t k1 = std::min(kfull, k0 + kPassK);
#pragma GCC unroll 4
      for (int h = 0; h < kParts; ++h) {
        Part a[MR][NR];
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
          for (int c = 0; c < NR; ++c) a[r][c] = part(acc[r][c], h);
        for (int64_t k = k0; k < k1; k += 16) {
          Part xv[MR];
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) xv[r] = pload(x + r * ldx + k, h);
#pragma GCC unroll 8
          for (int c = 0; c < NR; ++c) {
            Part wv = wpart(c, k, h);
            ppin(wv);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) a[r][c] = pfma(xv[r], wv, a[r][c]);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
          for (int c = 0; c < NR; ++c) part(acc[r][c], h) = a[r][c];
      }
    }
  }
}

// The K tail of a tile (kc - k < 16 left): acc[r][c] += x[r, k..kc) . W row c, with wtail(c, n)
// W row c's n tail elements (the rest zero).
template <int MR, int NR, typename WTail>
[[gnu::always_inline]] inline void tile_tail(const float* x, int64_t ldx, int64_t k, int64_t kc, WTail&& wtail,
                                             Vec16 (&acc)[MR][NR]) {
  const int64_t n = kc - k;
  Vec16 xv[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) xv[r] = vload(x + r * ldx + k, n);
#pragma GCC unroll 8
  for (int c = 0; c < NR; ++c) {
    const Vec16 wv = wtail(c, n);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc[r][c] = vfma(xv[r], wv, acc[r][c]);
  }
}

// Every accumulator of a tile to zero.
template <int MR, int NR>
[[gnu::always_inline]] inline void zero_tile(Vec16 (&acc)[MR][NR]) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) acc[r][c] = vzero();
}

// y[r, c] for r < MR, c < nr: each accumulator's tree sum, added to y unless first, then bias
// (may be null) added.
template <int MR, int NR>
[[gnu::always_inline]] inline void tile_store(const Vec16 (&acc)[MR][NR], int nr, float* y, int64_t ldy, bool first,
                                              const float* bias) {
#if defined(ASTRAI_ISA_V4)
  if constexpr (NR == 8) {
    const __mmask8 out = static_cast<__mmask8>((1u << nr) - 1);
    const __m256 b = bias ? _mm256_maskz_loadu_ps(out, bias) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m256 s = reduce8(acc[r][0].v, acc[r][1].v, acc[r][2].v, acc[r][3].v, acc[r][4].v, acc[r][5].v, acc[r][6].v,
                         acc[r][7].v);
      if (!first) s = _mm256_add_ps(_mm256_maskz_loadu_ps(out, y + r * ldy), s);
      if (bias) s = _mm256_add_ps(s, b);
      _mm256_mask_storeu_ps(y + r * ldy, out, s);
    }
    return;
  }
#endif
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) {
      if (c >= nr) break;
      float s = vsum(acc[r][c]);
      if (!first) s = y[r * ldy + c] + s;
      if (bias) s = s + bias[c];
      y[r * ldy + c] = s;
    }
  }
}

// A tile over W rows packed as [k/16][kGroup][16] f32 (wp: the tile's first row within the
// group; steps past kc zero), or read in place for the partial last group of a thread's
// share (w: row 0, rows `ld` elements apart, rows past nr aliasing row nr - 1).
template <int MR, int NR>
void tile_packed(const float* x, int64_t ldx, const float* wp, int64_t kc, int nr, float* y, int64_t ldy, bool first,
                 const float* bias) {
  Vec16 acc[MR][NR];
  zero_tile(acc);
  const int64_t kfull = kc & ~int64_t{15};
  // Step k (a multiple of 16) of row c is at wp + k * kGroup + c * 16: written so, not as
  // (k / 16 * kGroup + c) * 16, GCC keeps one index instead of five integer ops per step.
  tile_steps<MR, NR>(x, ldx, kfull, [&](int c, int64_t k, int h) { return pload(wp + k * kGroup + c * 16, h); }, acc);
  const int64_t k = kfull;
  if (k < kc) tile_tail<MR, NR>(x, ldx, k, kc, [&](int c, int64_t) { return vload(wp + k * kGroup + c * 16); }, acc);
  tile_store<MR, NR>(acc, nr, y, ldy, first, bias);
}

// The tile of tile_partial and tile_in_place (below) for rows of blocks: a block at a time,
// each row's pointer moving one block per iteration; the same operations per output as the
// float tiles. Q8_0 / Q4_0: two 16-wide steps per block. Q4_K: each row's 8 sub-block
// multipliers (d * sc, dmin * m) decoded once per super-block, then 16 steps; Q5_K the same with
// the 256 quants unpacked to bytes first (in L1). Q6_K: each row's
// 256 quants unpacked to int8 and its 16 multipliers d * scale once per super-block (in L1),
// then 16 steps of int8 times multiplier. `prefetch_lines`
// lines from `prefetch` go to L2, spread over the blocks.
template <int MR, int NR, DType T>
void tile_blocks(const float* x, int64_t ldx, const void* w, int64_t ld, int64_t kc, int nr, float* y, int64_t ldy,
                 bool first, const float* bias, const char* prefetch = nullptr, int64_t prefetch_lines = 0) {
  constexpr int64_t kBe = block_elems(T), kBlockBytes = block_bytes(T);
  const int64_t blocks = std::max<int64_t>(1, kc / kBe);
  const int64_t pf_step = (prefetch_lines + blocks - 1) / blocks;
  const char* pf = prefetch;
  const char* pf_end = prefetch ? prefetch + prefetch_lines * 64 : nullptr;
  const uint8_t* wrow[NR];
  for (int c = 0; c < NR; ++c) wrow[c] = static_cast<const uint8_t*>(w) + std::min(c, nr - 1) * row_bytes<T>(ld);
  Vec16 acc[MR][NR];
  zero_tile(acc);
  for (int64_t k = 0; k < kc; k += kBe) {
    if (pf < pf_end) {
      for (int64_t b = 0; b < pf_step; ++b) prefetch_l2(pf + b * 64);
      pf += pf_step * 64;
    }
    if constexpr (T == DType::kQ6_K) {
      alignas(64) int8_t q[NR][kQKBlock];
      float dm[NR][16];
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) {
        q6k_unpack(wrow[c], q[c]);
        q6k_multipliers(wrow[c], dm[c]);
      }
      for (int s = 0; s < 16; ++s)
        tile_step<MR, NR>(x + k + 16 * s, ldx, [&](int c, int h) { return pload_i8(q[c] + 16 * s, dm[c][s], h); }, acc);
    } else if constexpr (T == DType::kQ5_K) {
      alignas(64) uint8_t q[NR][kQKBlock];
      float dm[NR][16];
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) {
        q5k_unpack(wrow[c], q[c]);
        q4k_multipliers(wrow[c], dm[c]);
      }
      for (int s = 0; s < 16; ++s)
        tile_step<MR, NR>(x + k + 16 * s, ldx, [&](int c, int h) {
          return pload_u8(q[c] + 16 * s, dm[c][s / 2], dm[c][8 + s / 2], h);
        }, acc);
    } else if constexpr (T == DType::kQ4_K) {
      float dm[NR][16];
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) q4k_multipliers(wrow[c], dm[c]);
      for (int j = 0; j < 8; ++j) {
        const int shift = (j % 2) * 4;
        const int64_t qoff = kQ4KQuantsAt + j / 2 * 32;
#pragma GCC unroll 2
        for (int64_t half = 0; half < 32; half += 16)
          tile_step<MR, NR>(x + k + 32 * j + half, ldx, [&](int c, int h) {
            return pload_q4k(wrow[c] + qoff + half, shift, dm[c][j], dm[c][8 + j], h);
          }, acc);
      }
    } else {
      tile_step<MR, NR>(x + k, ldx, [&](int c, int h) { return pload_block<T>(wrow[c], 0, h); }, acc);
      tile_step<MR, NR>(x + k + 16, ldx, [&](int c, int h) { return pload_block<T>(wrow[c], 16, h); }, acc);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) wrow[c] += kBlockBytes;
  }
  tile_store<MR, NR>(acc, nr, y, ldy, first, bias);
}

// w: the tile's first row at the block's first k (for a block type, a multiple of its block), rows `ld`
// elements apart.
template <int MR, int NR, DType T>
void tile_partial(const float* x, int64_t ldx, const void* w, int64_t ld, int64_t kc, int nr, float* y, int64_t ldy,
                  bool first, const float* bias) {
  if constexpr (kBlockType<T>) {
    tile_blocks<MR, NR, T>(x, ldx, w, ld, kc, nr, y, ldy, first, bias);
  } else {
    const uint8_t* wrow[NR];
    for (int c = 0; c < NR; ++c) wrow[c] = static_cast<const uint8_t*>(w) + std::min(c, nr - 1) * ld * kElemBytes<T>;
    Vec16 acc[MR][NR];
    zero_tile(acc);
    const int64_t kfull = kc & ~int64_t{15};
    tile_steps<MR, NR>(x, ldx, kfull, [&](int c, int64_t k, int h) { return pload_w<T>(wrow[c] + k * kElemBytes<T>, h); },
                       acc);
    const int64_t k = kfull;
    if (k < kc)
      tile_tail<MR, NR>(x, ldx, k, kc, [&](int c, int64_t n) { return load_w<T>(wrow[c] + k * kElemBytes<T>, n); }, acc);
    tile_store<MR, NR>(acc, nr, y, ldy, first, bias);
  }
}

// A tile over NR full W rows read in place (the same operations per output as above). The rows
// are addressed from three pointers (rows 0-2, 3-5, 6-7) and one stride, all advanced each K
// step, so the loop's pointers stay in registers: with one pointer per row, 3 x rows and the
// bounds, GCC spilled pointers and stored a W vector to the stack every step (v4, M = 32, f32:
// 206 -> 222 GFLOP/s on two cores). `prefetch_lines` cache lines from `prefetch` (may be null)
// are requested into L2, spread evenly over the K steps.
template <int MR, int NR, DType T>
void tile_in_place(const float* x, int64_t ldx, const void* w, int64_t ld, int64_t kc, float* y, int64_t ldy,
                   bool first, const float* bias, const char* prefetch, int64_t prefetch_lines) {
  if constexpr (kBlockType<T>) {  // rows of blocks: one pointer per row
    tile_blocks<MR, NR, T>(x, ldx, w, ld, kc, NR, y, ldy, first, bias, prefetch, prefetch_lines);
    return;
  }
  constexpr int64_t esz = kElemBytes<T>;
  const int64_t s = ld * esz;
  const uint8_t* base[3] = {static_cast<const uint8_t*>(w), static_cast<const uint8_t*>(w) + 3 * s,
                            static_cast<const uint8_t*>(w) + 6 * s};
  const float* xr = x;
  Vec16 acc[MR][NR];
  zero_tile(acc);
  const int64_t steps = kc / 16;
  const int64_t pf_step = prefetch ? (prefetch_lines + std::max<int64_t>(1, steps) - 1) / std::max<int64_t>(1, steps) : 0;
  const char* pf = prefetch;
  const char* pf_end = prefetch ? prefetch + prefetch_lines * 64 : nullptr;
  if constexpr (kParts == 1 || MR * NR * kParts <= kAccRegs) {
    for (int64_t i = 0; i < steps; ++i) {
      if (pf < pf_end) {
        for (int64_t b = 0; b < pf_step; ++b) prefetch_l2(pf + b * 64);
        pf += pf_step * 64;
      }
      tile_step<MR, NR>(
          xr, ldx, [&](int c, int h) { return pload_w<T>(c % 3 == 0 ? base[c / 3] : base[c / 3] + (c % 3) * s, h); },
          acc);
      for (int b = 0; b < 3; ++b) base[b] += 16 * esz;
      xr += 16;
    }
  } else {
    // Passes of kPassK (tile_steps); the prefetches go out a pass's share at a time.
    (void)xr;
    for (int64_t k0 = 0; k0 < steps * 16; k0 += kPassK) {
      const int64_t k1 = std::min(steps * 16, k0 + kPassK);
      for (int64_t i = k0; i < k1 && pf < pf_end; i += 16) {
        for (int64_t b = 0; b < pf_step; ++b) prefetch_l2(pf + b * 64);
        pf += pf_step * 64;
      }
      tile_steps<MR, NR>(x + k0, ldx, k1 - k0, [&](int c, int64_t k, int h) {
        return pload_w<T>((c % 3 == 0 ? base[c / 3] : base[c / 3] + (c % 3) * s) + (k0 + k) * esz, h);
      }, acc);
    }
  }
  const int64_t k = steps * 16;
  if (k < kc) {
    tile_tail<MR, NR>(
        x, ldx, k, kc,
        [&](int c, int64_t n) { return load_w<T>(static_cast<const uint8_t*>(w) + c * s + k * esz, n); }, acc);
  }
  tile_store<MR, NR>(acc, NR, y, ldy, first, bias);
}

// Packs W rows [0, rows) x k in [k0, k0 + kc) (row-major, ld elements per row, dtype T) into
// groups of kGroup rows laid out [k/16][kGroup][16] f32; steps past kc and rows past `rows` are
// zero.
template <DType T>
void pack_block(const void* w, int64_t ld, int64_t rows, int64_t k0, int64_t kc, float* dst) {
  [[maybe_unused]] constexpr int64_t esz = kElemBytes<T>;
  const int64_t steps = (kc + 15) / 16;
  for (int64_t g = 0; g < rows; g += kGroup) {
    float* gd = dst + g * steps * 16;
    for (int c = 0; c < kGroup; ++c) {
      if (g + c >= rows) {
        for (int64_t st = 0; st < steps; ++st) vstore(gd + (st * kGroup + c) * 16, vzero());
        continue;
      }
      const uint8_t* row = static_cast<const uint8_t*>(w) + (g + c) * row_bytes<T>(ld);
      int64_t st = 0;
      for (; st < kc / 16; ++st) vstore(gd + (st * kGroup + c) * 16, load_w_at<T>(row, k0 + st * 16));
      if constexpr (!kBlockType<T>) {  // rows of blocks have no tail
        if (st < steps) vstore(gd + (st * kGroup + c) * 16, load_w<T>(row + (k0 + st * 16) * esz, kc - st * 16));
      }
    }
  }
}

ASTRAI_KERNELS_END
