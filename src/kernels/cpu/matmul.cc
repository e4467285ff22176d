// kernels::linear — batch-invariant y = x · W^T (+ bias) on AVX-512.
//
// Reduction order (the batch-invariance contract). K is cut into fixed blocks of kKb = 1024
// (the last may be shorter). For every output y[i, j]:
//   for each block b: 16 lane partial sums, lane l accumulating x[i, k] * w[j, k] over the
//     block's k = l, l + 16, ... in increasing k, one fused multiply-add each (the K tail is
//     zero-padded), reduced by one fixed tree (lane i + i+8, then i + i+4, i + i+2, i + i+1);
//   s = p_0, s = s + p_1, ..., s = s + p_last (sequential f32 adds), then y = s + bias[j].
// Every path (any M, any tile, packed or streamed weights, any thread count) performs exactly
// these operations per output, so y[i, :] is bit-identical whatever M is and whatever the
// other rows are. Tiling and threading only decide which outputs are computed together; the
// 16 accumulators of one output never mix with another's.
//
// Shape of the work: a register tile of kMr rows of x × kNr = 8 rows of W holds 24
// accumulators; each step of 16 k loads kMr + 8 vectors for 24 FMAs. Both operands are
// contiguous along K in their natural layouts (x [M, K], W [N, K]). For many rows W is packed
// (bf16/f16 widened to f32) per block of rows × kKb into one sequential stream that stays in
// L2 while every row tile of x passes over it (up to 64 rows: 8 W rows × kKb at a time, 32
// KiB, each widened once for all rows); for few rows (decode, memory-bound; f32 up to 64
// rows) W is read in place, converted inside the loop, 8 rows at a time over the whole K so
// the prefetchers see 8 sequential streams, with the rows split over the threads.
#include "kernels/cpu/matmul.h"

// GCC 12's AVX-512 headers (_mm512_undefined_ps) trip the uninitialized warnings.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/gemm_mode.h"
#include "kernels/cpu/reduce8.h"

namespace astrai::kernels {

namespace {

constexpr int kNr = 8;                // W rows per register tile
constexpr int kMr = 3;                // x rows per register tile
// K block of the reduction order, the same for every shape. Each block ends in a lane
// reduction (15 shuffles + 15 adds per 8 outputs); 1024 instead of 256 made that 4x rarer:
// +5-18% at M = 32-512, best of 3 on this machine.
constexpr int64_t kKb = 1024;
constexpr int64_t kSmallM = 8;        // up to this many rows: bf16/f16 weights read in place
constexpr int64_t kPackRows = 128;    // W rows per packed block (128 x 1024 x 4 B = 512 KiB)
constexpr int64_t kRowBlock = 192;    // x rows per pass over a packed block (multiple of kMr)
constexpr int64_t kL1PackM = 64;      // up to this many rows: f32 W in place, bf16/f16 packed 8 rows x kKb (L1)
constexpr int64_t kBlasMinRows = 16;  // non-invariant mode: BLAS from this many rows

std::atomic<bool> g_batch_invariant{true};

template <DType T>
inline __m512 load_w(const void* base, int64_t k, __mmask16 mask) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + k);
  } else if constexpr (T == DType::kBF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + k);
    return _mm512_cvtph_ps(h);
  }
}

template <DType T>
inline __m512 load_w_full(const void* base, int64_t k) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + k);
  } else if constexpr (T == DType::kBF16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + k));
    return _mm512_cvtph_ps(h);
  }
}

// Where W rows live for a tile: in place (row-major, `ld` elements apart; rows past nr alias
// row nr-1) or packed ([k/16][8 rows][16] f32, zero-padded to whole steps).
struct RowMajor {};
struct Packed {};

// The K tail of a tile (fewer than 16 of K left at k): acc[r][c] += x[r, k..kc) . W row c,
// where wtail(c, mask) gives W row c's tail vector (lanes past kc zero).
template <int MR, typename WTail>
[[gnu::always_inline]] inline void tile_tail(const float* x, int64_t ldx, int64_t k, int64_t kc, WTail&& wtail,
                                             __m512 (&acc)[MR][kNr]) {
  const __mmask16 mask = static_cast<__mmask16>((1u << (kc - k)) - 1);
  __m512 xv[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) xv[r] = _mm512_maskz_loadu_ps(mask, x + r * ldx + k);
#pragma GCC unroll 8
  for (int c = 0; c < kNr; ++c) {
    const __m512 wv = wtail(c, mask);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
  }
}

// y[r, c] for r < MR, c < nr: each accumulator reduced by the reduce8 tree, added to y unless
// first, then bias (may be null) added.
template <int MR>
[[gnu::always_inline]] inline void tile_store(const __m512 (&acc)[MR][kNr], int nr, float* y, int64_t ldy, bool first,
                                              const float* bias) {
  const __mmask8 out = static_cast<__mmask8>((1u << nr) - 1);
  const __m256 b = bias ? _mm256_maskz_loadu_ps(out, bias) : _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    __m256 s = reduce8(acc[r][0], acc[r][1], acc[r][2], acc[r][3], acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
    if (!first) s = _mm256_add_ps(_mm256_maskz_loadu_ps(out, y + r * ldy), s);
    if (bias) s = _mm256_add_ps(s, b);
    _mm256_mask_storeu_ps(y + r * ldy, out, s);
  }
}

// Adds the block's contribution to y[r, c] for r < MR, c < nr (see the order above):
// y = p (first block) or y + p, then + bias on the last block (bias may be null). Packed W,
// or in place for a partial group of rows (full groups in place: tile_rm8).
template <int MR, DType T, typename Layout>
void tile(const float* x, int64_t ldx, const void* w, int64_t ld, int64_t kc, int nr, float* y, int64_t ldy,
          bool first, const float* bias) {
  constexpr size_t esz = T == DType::kF32 ? 4 : 2;
  const uint8_t* wrow[kNr];
  if constexpr (std::is_same_v<Layout, RowMajor>) {
    for (int c = 0; c < kNr; ++c) wrow[c] = static_cast<const uint8_t*>(w) + std::min(c, nr - 1) * ld * esz;
  }
  const float* wp = static_cast<const float*>(w);
  __m512 acc[MR][kNr];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < kNr; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t kfull = kc & ~int64_t{15};
  int64_t k = 0;
  for (; k < kfull; k += 16) {
    __m512 xv[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xv[r] = _mm512_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 8
    for (int c = 0; c < kNr; ++c) {
      __m512 wv;
      if constexpr (std::is_same_v<Layout, RowMajor>) {
        wv = load_w_full<T>(wrow[c], k);
      } else {
        wv = _mm512_loadu_ps(wp + (k / 16 * kNr + c) * 16);
      }
      // Keep wv in a register: folded into each FMA it would be loaded MR times.
      asm("" : "+v"(wv));
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  if (k < kc) {
    tile_tail<MR>(x, ldx, k, kc, [&](int c, __mmask16 mask) {
      if constexpr (std::is_same_v<Layout, RowMajor>) return load_w<T>(wrow[c], k, mask);
      else return _mm512_loadu_ps(wp + (k / 16 * kNr + c) * 16);
    }, acc);
  }
  tile_store<MR>(acc, nr, y, ldy, first, bias);
}

// tile() for a full group of 8 W rows read in place (the same operations per output). The
// 8 rows are addressed from three pointers and one stride (rows 0, 1, 2, 4 from p0; 3, 5, 7
// from p3; 6 from p6), all advanced each K step, so the loop's pointers stay in registers:
// with 8 row pointers, 3 x rows, the prefetch walk and the bounds, GCC spilled pointers and
// stored a W vector to the stack every step. M = 32, f32: 206 -> 222 GFLOP/s on two cores
// (hot), 173 -> 190 on the 32000-row LM head; the forward's linear layers 34.7 -> 32.8 ms.
template <int MR, DType T>
void tile_rm8(const float* x, int64_t ldx, const void* w, int64_t ld, int64_t kc, float* y, int64_t ldy, bool first,
              const float* bias, const char* prefetch, int64_t prefetch_lines) {
  constexpr int64_t esz = T == DType::kF32 ? 4 : 2;
  const int64_t s = ld * esz;
  const uint8_t* p0 = static_cast<const uint8_t*>(w);
  const uint8_t* p3 = p0 + 3 * s;
  const uint8_t* p6 = p0 + 6 * s;
  const float* xr = x;
  __m512 acc[MR][kNr];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < kNr; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t steps = kc / 16;
  // About prefetch_lines cache lines from `prefetch` on, the same number in each K step until
  // they are covered (rounding up may touch a few lines more: prefetches never fault).
  const int64_t pf_step = prefetch ? (prefetch_lines + std::max<int64_t>(1, steps) - 1) / std::max<int64_t>(1, steps) : 0;
  const char* pf = prefetch;
  const char* pf_end = prefetch ? prefetch + prefetch_lines * 64 : nullptr;
  for (int64_t i = 0; i < steps; ++i) {
    if (pf < pf_end) {
      for (int64_t b = 0; b < pf_step; ++b) _mm_prefetch(pf + b * 64, _MM_HINT_T1);
      pf += pf_step * 64;
    }
    __m512 xv[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xv[r] = _mm512_loadu_ps(xr + r * ldx);
    const uint8_t* rows[kNr] = {p0, p0 + s, p0 + 2 * s, p3, p0 + 4 * s, p3 + 2 * s, p6, p3 + 4 * s};
#pragma GCC unroll 8
    for (int c = 0; c < kNr; ++c) {
      __m512 wv = load_w_full<T>(rows[c], 0);
      asm("" : "+v"(wv));
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
    }
    p0 += 16 * esz;
    p3 += 16 * esz;
    p6 += 16 * esz;
    xr += 16;
  }
  const int64_t k = steps * 16;
  if (k < kc) {
    tile_tail<MR>(x, ldx, k, kc, [&](int c, __mmask16 mask) { return load_w<T>(static_cast<const uint8_t*>(w) + c * s, k, mask); },
                  acc);
  }
  tile_store<MR>(acc, kNr, y, ldy, first, bias);
}

template <DType T, typename Layout>
using TileFn = void (*)(const float*, int64_t, const void*, int64_t, int64_t, int, float*, int64_t, bool,
                        const float*);

template <DType T, typename Layout>
TileFn<T, Layout> tile_fn(int64_t mr) {
  static_assert(kMr == 3);
  return mr == 3 ? &tile<3, T, Layout> : mr == 2 ? &tile<2, T, Layout> : &tile<1, T, Layout>;
}

// dst[k] = float(src[k]) for k < count (exact for bf16 and f16).
template <DType T>
void pack_row(const void* src, int64_t count, float* dst) {
  int64_t k = 0;
  for (; k + 16 <= count; k += 16) _mm512_storeu_ps(dst + k, load_w_full<T>(src, k));
  if (k < count) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (count - k)) - 1);
    _mm512_mask_storeu_ps(dst + k, mask, load_w<T>(src, k, mask));
  }
}

// Packs W rows [0, rows) × k in [k0, k0 + kc) (W row-major, ld elements per row, dtype T) into
// groups of 8 rows laid out [k/16][8][16] f32; steps past kc and rows past `rows` are zero.
template <DType T>
void pack_block(const void* w, int64_t ld, int64_t rows, int64_t k0, int64_t kc, float* dst) {
  constexpr size_t esz = T == DType::kF32 ? 4 : 2;
  const int64_t steps = (kc + 15) / 16;
  for (int64_t g = 0; g < rows; g += kNr) {
    float* gd = dst + g * steps * 16;
    for (int c = 0; c < kNr; ++c) {
      if (g + c >= rows) {
        for (int64_t s = 0; s < steps; ++s) _mm512_storeu_ps(gd + (s * kNr + c) * 16, _mm512_setzero_ps());
        continue;
      }
      const uint8_t* src = static_cast<const uint8_t*>(w) + ((g + c) * ld + k0) * esz;
      int64_t s = 0;
      for (; s < kc / 16; ++s) _mm512_storeu_ps(gd + (s * kNr + c) * 16, load_w_full<T>(src, s * 16));
      if (s < steps) {
        const __mmask16 mask = static_cast<__mmask16>((1u << (kc - s * 16)) - 1);
        _mm512_storeu_ps(gd + (s * kNr + c) * 16, load_w<T>(src, s * 16, mask));
      }
    }
  }
}

// Rows of the next register tile when `rem` rows are left: 3s, with a 1-row remainder turned
// into two 2-row tiles (a 1-row tile loads a weight vector per 8 FMAs). Values never depend on it.
inline int64_t tile_rows(int64_t rem) { return rem >= 4 && rem % kMr == 1 ? 2 : std::min<int64_t>(kMr, rem); }

inline int64_t num_tiles(int64_t m) {
  int64_t n = 0;
  for (int64_t i = 0; i < m; i += tile_rows(m - i)) ++n;
  return n;
}

template <DType T>
void linear_invariant(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  const int64_t n = w.rows, kk = w.cols;
  constexpr size_t esz = T == DType::kF32 ? 4 : 2;
  const uint8_t* wb = static_cast<const uint8_t*>(w.data);
  // f32 weights are read in place up to 64 rows (packing them only copies: 120 -> 150
  // GFLOP/s at M = 32 on two cores, cold weights); bf16/f16 are widened once per group
  // above 8 rows instead of once per row tile.
  const bool pack = m > (T == DType::kF32 ? kL1PackM : kSmallM);
  const int64_t groups = (n + kNr - 1) / kNr;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    // A contiguous share of whole 8-row groups per thread (the partition never affects values).
    const int64_t r0 = std::min(n, groups * t / nt * kNr), r1 = std::min(n, groups * (t + 1) / nt * kNr);
    if (!pack) {
      const int64_t tiles = num_tiles(m);
      // Decode (and f32 decode batches): W read in place, 8 rows at a time over the whole K;
      // every row tile of x passes over each 8 x kKb block of weights while it is in L1.
      for (int64_t j = r0; j < r1; j += kNr) {
        const int nr = static_cast<int>(std::min<int64_t>(kNr, r1 - j));
        for (int64_t k0 = 0; k0 < kk; k0 += kKb) {
          const int64_t kc = std::min(kKb, kk - k0);
          const bool first = k0 == 0, last = k0 + kc == kk;
          const float* bj = last && bias ? bias + j : nullptr;
          // The next group of 8 rows (contiguous, 8 * kk elements further) is prefetched
          // while this one is computed, its share for this K block spread evenly over the
          // row tiles: short rows keep the hardware prefetchers from ramping up on each
          // group's 8 streams, and a burst of requests would stall the tile that issues it.
          const bool pf = j + 2 * kNr <= r1;
          const char* next = reinterpret_cast<const char*>(wb + ((j + kNr) * kk + 8 * k0) * esz);
          const int64_t lines = kNr * kc * static_cast<int64_t>(esz) / 64;
          for (int64_t i = 0, ti = 0; i < m; ++ti) {
            const int64_t mr = tile_rows(m - i);
            const int64_t l0 = lines * ti / tiles, l1 = lines * (ti + 1) / tiles;
            if (nr == kNr) {
              auto fn = mr == 3 ? &tile_rm8<3, T> : mr == 2 ? &tile_rm8<2, T> : &tile_rm8<1, T>;
              fn(x + i * kk + k0, kk, wb + (j * kk + k0) * esz, kk, kc, y + i * n + j, n, first, bj,
                 pf ? next + l0 * 64 : nullptr, l1 - l0);
            } else {  // the share's last, partial group: nothing after it to prefetch
              tile_fn<T, RowMajor>(mr)(x + i * kk + k0, kk, wb + (j * kk + k0) * esz, kk, kc, nr, y + i * n + j, n,
                                       first, bj);
            }
            i += mr;
          }
        }
      }
    } else if (m <= kL1PackM) {
      // Decode batches: each group of 8 W rows x kKb is widened once into an L1-resident
      // buffer that every row tile of x reuses. Groups go one at a time over the whole K, so
      // W is read as 8 sequential streams, and the next group's rows (contiguous in memory)
      // are prefetched a K block at a time, as in the in-place path.
      alignas(64) float small[kNr * kKb];
      for (int64_t j = r0; j < r1; j += kNr) {
        const int nr = static_cast<int>(std::min<int64_t>(kNr, r1 - j));
        const char* next = j + 2 * kNr <= r1 ? reinterpret_cast<const char*>(wb + (j + kNr) * kk * esz) : nullptr;
        for (int64_t k0 = 0; k0 < kk; k0 += kKb) {
          const int64_t kc = std::min(kKb, kk - k0);
          const bool first = k0 == 0, last = k0 + kc == kk;
          const float* bj = last && bias ? bias + j : nullptr;
          pack_block<T>(wb + j * kk * esz, kk, nr, k0, kc, small);
          if (next) {
            const int64_t from = kNr * k0 * static_cast<int64_t>(esz), to = kNr * (k0 + kc) * static_cast<int64_t>(esz);
            for (int64_t b = from; b < to; b += 64) _mm_prefetch(next + b, _MM_HINT_T1);
          }
          for (int64_t i = 0; i < m;) {
            const int64_t mr = tile_rows(m - i);
            tile_fn<DType::kF32, Packed>(mr)(x + i * kk + k0, kk, small, 0, kc, nr, y + i * n + j, n, first, bj);
            i += mr;
          }
        }
      }
    } else {
      thread_local std::vector<float> packed;
      if (r0 < r1) packed.resize(static_cast<size_t>(kPackRows * kKb));
      // Rows of x per pass: their partial sums y[mb rows, 128 cols] stay in L2 across the K
      // blocks. Re-packing the W block for every pass costs well under 1% of the FMAs.
      for (int64_t nb0 = r0; nb0 < r1; nb0 += kPackRows) {
        const int64_t nb1 = std::min(r1, nb0 + kPackRows);
        for (int64_t mb0 = 0; mb0 < m; mb0 += kRowBlock) {
          const int64_t mb1 = std::min(m, mb0 + kRowBlock);
          for (int64_t k0 = 0; k0 < kk; k0 += kKb) {
            const int64_t kc = std::min(kKb, kk - k0);
            const bool first = k0 == 0, last = k0 + kc == kk;
            pack_block<T>(wb + nb0 * kk * esz, kk, nb1 - nb0, k0, kc, packed.data());
            const int64_t steps = (kc + 15) / 16;
            for (int64_t i = mb0; i < mb1;) {
              const int64_t mr = tile_rows(mb1 - i);
              for (int64_t j = nb0; j < nb1; j += kNr) {
                const int nr = static_cast<int>(std::min<int64_t>(kNr, nb1 - j));
                const float* bj = last && bias ? bias + j : nullptr;
                tile_fn<DType::kF32, Packed>(mr)(x + i * kk + k0, kk, packed.data() + (j - nb0) * steps * 16, 0, kc,
                                                 nr, y + i * n + j, n, first, bj);
              }
              i += mr;
            }
          }
        }
      }
    }
  }
}

// Non-invariant mode, many rows: cblas_sgemm (bf16/f16 weights widened per block of rows).
template <DType T>
void linear_blas(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  const int64_t n = w.rows, kk = w.cols;
  if constexpr (T == DType::kF32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(kk), 1.0f, x, static_cast<int>(kk), static_cast<const float*>(w.data),
                static_cast<int>(kk), 0.0f, y, static_cast<int>(n));
  } else {
    const int64_t rows = std::max<int64_t>(64, (int64_t{4} << 20) / std::max<int64_t>(1, kk * 4));
    std::vector<float> wf(static_cast<size_t>(std::min(rows, n) * kk));
    for (int64_t j0 = 0; j0 < n; j0 += rows) {
      const int64_t nr = std::min(rows, n - j0);
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + j0 * kk * 2;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < nr; ++r) pack_row<T>(src + r * kk * 2, kk, wf.data() + r * kk);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(nr),
                  static_cast<int>(kk), 1.0f, x, static_cast<int>(kk), wf.data(), static_cast<int>(kk), 0.0f, y + j0,
                  static_cast<int>(n));
    }
  }
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
  }
}

template <DType T>
void linear_typed(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  if (w.cols == 0) {  // empty reduction: y = bias (or 0)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < w.rows; ++j) y[i * w.rows + j] = bias ? bias[j] : 0.0f;
    return;
  }
  if (!g_batch_invariant.load(std::memory_order_relaxed) && m >= kBlasMinRows) return linear_blas<T>(x, m, w, bias, y);
  linear_invariant<T>(x, m, w, bias, y);
}

}  // namespace

void set_batch_invariant(bool on) { g_batch_invariant.store(on, std::memory_order_relaxed); }
bool batch_invariant() { return g_batch_invariant.load(std::memory_order_relaxed); }

void linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  ASTRAI_CHECK(m >= 0 && w.rows >= 0 && w.cols >= 0, "linear: negative shape");
  if (m == 0 || w.rows == 0) return;
  switch (w.dtype) {
    case DType::kF32: return linear_typed<DType::kF32>(x, m, w, bias, y);
    case DType::kBF16: return linear_typed<DType::kBF16>(x, m, w, bias, y);
    case DType::kF16: return linear_typed<DType::kF16>(x, m, w, bias, y);
    default: fail("linear: unsupported weight dtype ", dtype_name(w.dtype));
  }
}

}  // namespace astrai::kernels
