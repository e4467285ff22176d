// The score loop shared by the attention kernels (attention.cc, attention_backward.cc): dot
// products of query rows with key rows in the contract's order (vec_math.h's dot: 16 lane
// partial sums by fused multiply-adds over dim, the tail zero-padded, the fixed tree), then
// times the scale. Tiles of R query rows x NK keys share each load; the shape is per level:
//   v4: up to 3 rows x 8 keys (24 zmm accumulators), the 8 sums of a row reduced together;
//     prefill: 3 rows x 32 keys of K transposed, keys across the lanes (qk_tile_transposed);
//   v3: dims a multiple of 16: 3 or 2 rows x 4 keys or 1 row x 8 keys, a part (8 lanes) at a
//     time (12 or 8 ymm accumulators), 8 sums reduced together; other dims as neon; prefill:
//     3 rows x 16 keys of K transposed, keys across the lanes (qk_tile_transposed);
//   neon: 2 rows x 2 keys or 1 row x 4 keys (16 q accumulators);
//   generic: one score at a time.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/level.h"
#include "kernels/cpu/reduce8.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

// The query rows of one work item (row r at rows[r], its scores at s + r * ld), their
// addresses worked out once per item, not per call.
struct QueryRows {
  const float* const* rows;
  int64_t count, dim;
};

#if defined(ASTRAI_ISA_V4)
constexpr int kQkMaxRows = 3;
constexpr int qk_keys(int64_t) { return 8; }
#elif defined(ASTRAI_ISA_GENERIC)
constexpr int kQkMaxRows = 1;
constexpr int qk_keys(int64_t) { return 1; }
#else
constexpr int kQkMaxRows = 2;
constexpr int qk_keys(int64_t rows) { return rows == 1 ? 4 : 2; }
#endif

// Up to R query rows against NK keys: s[r][c] = (q[r] . k[c]) * scale for c < nk. Each K
// vector is loaded once for all R rows.
template <int R, int NK, typename E>
inline void qk_tile(const float* const* q, const E* const* k, int64_t dim, float scale, int64_t nk, float* const* s) {
  Vec16 acc[R][NK];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NK; ++c) acc[r][c] = vzero();
  for (int64_t d0 = 0; d0 < dim; d0 += kLanes) {
    const int64_t n = dim - d0;
    Vec16 qv[R];
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) qv[r] = vload_n(q[r] + d0, n);
#pragma GCC unroll 8
    for (int c = 0; c < NK; ++c) {
      const Vec16 kv = vload_elem_n(k[c] + d0, n);
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r) acc[r][c] = vfma(qv[r], kv, acc[r][c]);
    }
  }
#if defined(ASTRAI_ISA_V4)
  if constexpr (NK == 8) {
    const __mmask8 store = static_cast<__mmask8>((1u << nk) - 1);
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r)
      _mm256_mask_storeu_ps(s[r], store,
                            _mm256_mul_ps(reduce8(acc[r][0].v, acc[r][1].v, acc[r][2].v, acc[r][3].v, acc[r][4].v,
                                                  acc[r][5].v, acc[r][6].v, acc[r][7].v),
                                          _mm256_set1_ps(scale)));
    return;
  }
#endif
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NK; ++c)
      if (c < nk) s[r][c] = vsum(acc[r][c]) * scale;
}

#if defined(ASTRAI_ISA_V3)
inline __m256 pload_elem(const float* p, int h) { return pload(p, h); }
inline __m256 pload_elem(const uint16_t* p, int h) { return pload_bf16(p, h); }

// v3, dim a multiple of 16: R query rows x NK keys (3 x 4, 2 x 4 or 1 x 8), s[r][c] for c < nk.
// The partial-sum vectors of lanes 0-7 (part 0) are formed first and parked in L1, then those
// of lanes 8-15 (part 1), so at most 12 accumulators are live (with 3 query parts and one K
// part: all 16 ymm); each lane's FMAs run in the contract's order. Lane i + lane i+8 (the
// tree's first step), then reduce8_halves, 8 scores at a time.
constexpr int qk_halves_keys(int rows) { return rows == 1 ? 8 : 4; }

template <int R, typename E>
inline void qk_tile_halves(const float* const* q, const E* const* k, int64_t dim, float scale, int64_t nk,
                           float* const* s) {
  constexpr int NK = qk_halves_keys(R), A = R * NK;
  alignas(32) float parked[A][8];
  __m256 acc[A];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 12
    for (int i = 0; i < A; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t d0 = 0; d0 < dim; d0 += kLanes) {
      __m256 qv[R];
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r) qv[r] = pload(q[r] + d0, h);
#pragma GCC unroll 8
      for (int c = 0; c < NK; ++c) {
        __m256 kv = pload_elem(k[c] + d0, h);
        asm("" : "+x"(kv));  // one load for the R FMAs (GCC would fold it into each of them)
#pragma GCC unroll 3
        for (int r = 0; r < R; ++r) acc[r * NK + c] = _mm256_fmadd_ps(qv[r], kv, acc[r * NK + c]);
      }
    }
    if (h == 0) {
#pragma GCC unroll 12
      for (int i = 0; i < A; ++i) _mm256_store_ps(parked[i], acc[i]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < A; ++i) acc[i] = _mm256_add_ps(_mm256_load_ps(parked[i]), acc[i]);
  const __m256 sv = _mm256_set1_ps(scale);
  alignas(32) float out[16];
  _mm256_store_ps(out, _mm256_mul_ps(reduce8_halves(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]), sv));
  if constexpr (A == 12)  // row 2's 4 scores (the other 4 lanes repeat them)
    _mm256_store_ps(out + 8, _mm256_mul_ps(reduce8_halves(acc[8], acc[9], acc[10], acc[11], acc[8], acc[9], acc[10],
                                                          acc[11]), sv));
  if (nk == NK) {
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) {
      if constexpr (NK == 4) _mm_storeu_ps(s[r], _mm_load_ps(out + 4 * r));
      else _mm256_storeu_ps(s[r], _mm256_load_ps(out));
    }
    return;
  }
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < nk; ++c) s[r][c] = out[r * NK + c];
}

#endif

#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
// Prefill, dim a multiple of 16: scores against a chunk of keys transposed once per call
// (kt[d * ldk + c] = key c's dim d, f32; attention.cc), R rows x 16 * NKV keys a tile with the
// keys across the lanes, so no score needs a horizontal sum. Score (r, c)'s lane partial sum
// i (dims i, i + 16, ...) is one FMA chain in lane c of an accumulator, as in the lane-major
// tiles; lanes i and i + 8 are added as each pair of chains ends and parked in L1, then the
// tree's other steps (i + i+4, i + i+2, i + i+1) are plain vertical adds: the same operations
// as vsum, 16 scores at once. 3 rows x 16 keys on v3 (12 ymm accumulators, 2 K vectors and a
// broadcast: 15 ymm), x 32 keys on v4 (12 zmm accumulators; 4 or 6 rows measured no faster).
#if defined(ASTRAI_ISA_V4)
constexpr int kQkTransposedVecs = 2;
#else
constexpr int kQkTransposedVecs = 1;
#endif
constexpr int64_t kQkTransposedKeys = 16 * kQkTransposedVecs;

// T: dim / 16 when known at compile time (4 and 8: q/k dims 64 and 128, the loops unrolled), else 0.
template <int R, int T>
inline void qk_tile_transposed(const float* const* q, const float* kt, int64_t ldk, int64_t dim_rt, float scale,
                               float* const* s) {
  constexpr int NV = kQkTransposedVecs;
  const int64_t dim = T > 0 ? 16 * T : dim_rt;
  alignas(64) float parked[8][R][NV][16];
  for (int i = 0; i < 8; ++i) {
    Vec16 lo[R][NV], hi[R][NV];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) lo[r][c] = hi[r][c] = vzero();
#pragma GCC unroll 8
    for (int64_t d = i; d < dim; d += kLanes) {
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {  // dims d (lane i) and d + 8 (lane i + 8)
        Vec16 k[NV];
#pragma GCC unroll 2
        for (int c = 0; c < NV; ++c) {
          Vec16 kc = vload(kt + (d + 8 * half) * ldk + 16 * c);
          pin(kc);  // one load for the R rows' FMAs
          k[c] = kc;
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const Vec16 b(q[r][d + 8 * half]);
#pragma GCC unroll 2
          for (int c = 0; c < NV; ++c) {
            Vec16& acc = half == 0 ? lo[r][c] : hi[r][c];
            acc = vfma(b, k[c], acc);
          }
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) vstore(parked[i][r][c], lo[r][c] + hi[r][c]);
  }
  const Vec16 sv(scale);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) {
      Vec16 t[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) t[i] = vload(parked[i][r][c]) + vload(parked[i + 4][r][c]);
      vstore(s[r] + 16 * c, ((t[0] + t[2]) + (t[1] + t[3])) * sv);
    }
}

template <int T>
inline void qk_tile_transposed_rows(int64_t nr, const float* const* q, const float* kt, int64_t ldk, int64_t dim,
                                    float scale, float* const* o) {
  if (nr == 3) qk_tile_transposed<3, T>(q, kt, ldk, dim, scale, o);
  else if (nr == 2) qk_tile_transposed<2, T>(q, kt, ldk, dim, scale, o);
  else qk_tile_transposed<1, T>(q, kt, ldk, dim, scale, o);
}

// Scores of every query row against the first n (<= ldk) keys of a transposed chunk:
// s[r * ld + c] for c < n rounded up to a multiple of kQkTransposedKeys (the chunk is zero past
// its keys; ld and ldk are multiples of it).
inline void qk_scores_transposed(const QueryRows& qr, const float* kt, int64_t ldk, int64_t n, float scale, float* s,
                                 int64_t ld) {
  constexpr int64_t step = 3;
  for (int64_t r0 = 0; r0 < qr.count; r0 += step) {
    const int64_t nr = std::min<int64_t>(step, qr.count - r0);
    const float* q[step];
    float* out[step];
    for (int64_t i = 0; i < step; ++i) {
      q[i] = qr.rows[r0 + std::min(i, nr - 1)];
      out[i] = s + (r0 + std::min(i, nr - 1)) * ld;
    }
    for (int64_t c0 = 0; c0 < n; c0 += kQkTransposedKeys) {
      float* o[step];
      for (int64_t i = 0; i < step; ++i) o[i] = out[i] + c0;
      if (qr.dim == 64) qk_tile_transposed_rows<4>(nr, q, kt + c0, ldk, qr.dim, scale, o);
      else if (qr.dim == 128) qk_tile_transposed_rows<8>(nr, q, kt + c0, ldk, qr.dim, scale, o);
      else qk_tile_transposed_rows<0>(nr, q, kt + c0, ldk, qr.dim, scale, o);
    }
  }
}
#endif

// The n keys at kr (ks apart) in blocks of NK: tile(k, nk, o) with the block's NK key rows (a
// short block repeats its last key), its key count and the R rows' outputs at its offset.
template <int R, int NK, typename E, typename Tile>
inline void for_each_key_block(const E* kr, int64_t ks, int64_t n, float* const* out, Tile&& tile) {
  for (int64_t i0 = 0; i0 < n; i0 += NK) {
    const int64_t nk = std::min<int64_t>(NK, n - i0);
    const E* k[NK];
#pragma GCC unroll 8
    for (int64_t c = 0; c < NK; ++c) k[c] = kr + (i0 + std::min<int64_t>(c, nk - 1)) * ks;
    float* o[R];
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) o[r] = out[r] + i0;
    tile(static_cast<const E* const*>(k), nk, static_cast<float* const*>(o));
  }
}

template <int R, typename E>
inline void qk_rows(const float* const* q, const E* kr, int64_t ks, int64_t n, int64_t dim, float scale, float* const* out) {
  for_each_key_block<R, qk_keys(R)>(kr, ks, n, out, [&](const E* const* k, int64_t nk, float* const* o) {
    qk_tile<R, qk_keys(R)>(q, k, dim, scale, nk, o);
  });
}

#if defined(ASTRAI_ISA_V3)
// qk_rows for dims a multiple of 16 (R = 1, 2 or 3).
template <int R, typename E>
inline void qk_rows_halves(const float* const* q, const E* kr, int64_t ks, int64_t n, int64_t dim, float scale,
                           float* const* out) {
  for_each_key_block<R, qk_halves_keys(R)>(kr, ks, n, out, [&](const E* const* k, int64_t nk, float* const* o) {
    qk_tile_halves<R>(q, k, dim, scale, nk, o);
  });
}
#endif

// Scores of every query row against n keys (rows kr + i * ks), written at key offset p0:
// s[r * ld + p0 + i] = (q_r . k_i) * scale. Query rows go kQkMaxRows at a time, sharing each
// K load; a run's K rows (one page, or 64 positions) stay in L1 for all row groups.
template <typename E>
inline void qk_scores(const QueryRows& qr, const E* kr, int64_t ks, int64_t p0, int64_t n, float scale, float* s,
                      int64_t ld) {
#if defined(ASTRAI_ISA_V3)
  const bool halves = qr.dim % kLanes == 0;  // then rows go 3 at a time (qk_rows_halves)
  const int64_t step = halves ? 3 : kQkMaxRows;
#else
  constexpr int64_t step = kQkMaxRows;
#endif
  for (int64_t r0 = 0; r0 < qr.count; r0 += step) {
    const int64_t nr = std::min<int64_t>(step, qr.count - r0);
    const float* q[3] = {qr.rows[r0], qr.rows[r0], qr.rows[r0]};
    float* out[3] = {s, s, s};  // entries past nr unused
    for (int64_t i = 0; i < nr; ++i) {
      q[i] = qr.rows[r0 + i];
      out[i] = s + (r0 + i) * ld + p0;
    }
#if defined(ASTRAI_ISA_V3)
    if (halves) {
      if (nr == 3) qk_rows_halves<3>(q, kr, ks, n, qr.dim, scale, out);
      else if (nr == 2) qk_rows_halves<2>(q, kr, ks, n, qr.dim, scale, out);
      else qk_rows_halves<1>(q, kr, ks, n, qr.dim, scale, out);
      continue;
    }
#endif
    if (nr == 3) qk_rows<(kQkMaxRows >= 3 ? 3 : 1)>(q, kr, ks, n, qr.dim, scale, out);
    else if (nr == 2) qk_rows<(kQkMaxRows >= 2 ? 2 : 1)>(q, kr, ks, n, qr.dim, scale, out);
    else qk_rows<1>(q, kr, ks, n, qr.dim, scale, out);
  }
}

ASTRAI_KERNELS_END
