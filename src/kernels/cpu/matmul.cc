// kernels::linear — batch-invariant y = x · W^T (+ bias), per instruction-set level.
//
// Reduction order (the batch-invariance contract, the same on every level). K is cut into fixed
// blocks of kKb = 1024 (the last may be shorter). For every output y[i, j]:
//   for each block b: 16 lane partial sums, lane l accumulating x[i, k] * w[j, k] over the
//     block's k = l, l + 16, ... in increasing k, one fused multiply-add each (the K tail is
//     zero-padded), reduced by one fixed tree (lane i + i+8, then i + i+4, i + i+2, i + i+1);
//   s = p_0, s = s + p_1, ..., s = s + p_last (sequential f32 adds), then y = s + bias[j].
// Every path (any M, any tile, packed or streamed weights, any thread count, any level)
// performs exactly these operations per output, so y[i, :] is bit-identical whatever M is,
// whatever the other rows are and whatever the CPU level. The generic level computes it one
// output at a time, as written above; the SIMD levels tile it (linear_tile.h).
//
// Shape of the work on the SIMD levels: a register tile of up to kMaxRows rows of x × a few W
// rows. Both operands are contiguous along K in their natural layouts (x [M, K], W [N, K]).
// For many rows W is packed (bf16/f16 widened to f32) per block of rows × kKb into one
// sequential stream that stays in L2 while every row tile of x passes over it (up to 64 rows:
// one group of W rows × kKb at a time, in L1, each widened once for all rows); for few rows
// (decode, memory-bound; f32 up to 64 rows) W is read in place, converted inside the loop, a
// group of rows at a time over the whole K so the prefetchers see that many sequential
// streams, with the groups split over the threads (on v3 and v4, one row of x against f32, bf16
// or f16 W reads two far-apart rows at a time instead, each over its whole K: gemv_rows).
#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/gemm_mode.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/level_table.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_tile.h"
#include "kernels/cpu/simd.h"

ASTRAI_KERNELS_BEGIN

namespace {

constexpr int64_t kBlasMinRows = 16;  // non-invariant mode: BLAS from this many rows

// The contract for one row of x against kRows W rows (w: the first, the others `stride` bytes
// apart) over the whole K: s[r] = the block sums of x . W row r, before the bias. The generic
// level computes every output this way (kRows = 1), the reference every other level must equal;
// v3 and v4 read batch-1 float W two rows at a time (gemv_rows).
template <int kRows, DType T>
void dot_rows(const float* x, const uint8_t* w, int64_t stride, int64_t kk, float* s) {
  for (int64_t k0 = 0; k0 < kk; k0 += kKb) {
    const int64_t kc = std::min(kKb, kk - k0);
    Vec16 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = vzero();
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16) {
      const Vec16 xv = vload(x + k0 + k);
      for (int r = 0; r < kRows; ++r) acc[r] = vfma(xv, load_w_at<T>(w + r * stride, k0 + k), acc[r]);
    }
    if constexpr (!kBlockType<T>) {  // rows of blocks have no tail
      if (k < kc) {
        const Vec16 xv = vload(x + k0 + k, kc - k);
        for (int r = 0; r < kRows; ++r)
          acc[r] = vfma(xv, load_w<T>(w + r * stride + (k0 + k) * kElemBytes<T>, kc - k), acc[r]);
      }
    }
    for (int r = 0; r < kRows; ++r) s[r] = k0 == 0 ? vsum(acc[r]) : s[r] + vsum(acc[r]);
  }
}

#if defined(ASTRAI_ISA_GENERIC)

template <DType T>
void linear_invariant(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  const int64_t n = w.rows, kk = w.cols;
  const uint8_t* wb = static_cast<const uint8_t*>(w.data);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* wj = wb + j * row_bytes<T>(kk);
    for (int64_t i = 0; i < m; ++i) {
      float s;
      dot_rows<1, T>(x + i * kk, wj, row_bytes<T>(kk), kk, &s);
      y[i * n + j] = bias ? s + bias[j] : s;
    }
  }
}

#else

constexpr int64_t kSmallM = 8;       // up to this many rows: bf16/f16/Q8_0/Q4_0/Q4_K/Q6_K weights read in place
constexpr int64_t kL1PackM = 64;     // up to this many rows: f32 W in place, bf16/f16 packed one group x kKb (L1)
#if defined(ASTRAI_ISA_V4)
// f32 decode batches (up to kL1PackM rows) read W in place: packing it only copies (120 -> 150
// GFLOP/s at M = 32 on two cores, cold weights). Other levels widen a group into L1 first (v3,
// M = 32: +8% over in place).
constexpr bool kF32BatchesInPlace = true;
// Many rows, the order of the work over a packed W block (only the order: the bits are the same):
//   false: each 3-row tile of x over the whole block, re-reading W from L2 (1.5 flop per byte of
//          W); best on AMD Zen 4/5 (93-96% of OpenBLAS on Zen 4);
//   true:  each group of W rows in turn, hot in L1, under blocks of kL1RowBlock rows of x. Chosen
//          on Intel, measured on a 5th-gen Xeon, whose two 512-bit FMA ports outrun L2 (512 rows,
//          one thread: 80-89 -> 91-114 GFLOP/s).
bool group_in_l1() {
  static const bool intel = cpu_info().vendor == "GenuineIntel";
  return intel;
}
#else
constexpr bool kF32BatchesInPlace = false;
// Tiles of at most 3 x 4 (16 ymm / 32 q registers) would re-read a packed L2 block too often
// (2/3 of a byte of W per flop): always the L1 order.
bool group_in_l1() { return true; }
#endif
// Batch-1 decode with f32, bf16 or f16 W reads two far-apart W rows at a time (gemv_rows)
// instead of through the group tiles: measured faster on v3 and v4; neon is unmeasured, so it
// keeps the tiles.
#if defined(ASTRAI_ISA_NEON)
constexpr bool kDecodeInRows = false;
#else
constexpr bool kDecodeInRows = true;
#endif
constexpr int64_t kL1RowBlock = 64;  // rows of x per pass over a group in L1 (v3, 512 x 768 x 768: 48-64 best)

using PackedTileFn = void (*)(const float*, int64_t, const float*, int64_t, int, float*, int64_t, bool, const float*);
template <DType T>
using InPlaceTileFn = void (*)(const float*, int64_t, const void*, int64_t, int64_t, float*, int64_t, bool,
                               const float*, const char*, int64_t);
template <DType T>
using PartialTileFn = void (*)(const float*, int64_t, const void*, int64_t, int64_t, int, float*, int64_t, bool,
                               const float*);

// The tile functions for MR rows of x (1..3) and sub_rows(MR) W rows.
template <int MR>
struct Tiles {
  static constexpr int kNr = sub_rows(MR);
  static PackedTileFn packed() { return &tile_packed<MR, kNr>; }
  template <DType T>
  static InPlaceTileFn<T> in_place() { return &tile_in_place<MR, kNr, T>; }
  template <DType T>
  static PartialTileFn<T> partial() { return &tile_partial<MR, kNr, T>; }
};

// The tiles of mr rows of x covering one packed group of kGroup W rows (nr of them real).
void packed_group(int64_t mr, const float* x, int64_t ldx, const float* wp, int64_t kc, int nr, float* y, int64_t ldy,
                  bool first, const float* bias) {
  const int sub = sub_rows(mr);
  const PackedTileFn fn = mr == 3 ? Tiles<3>::packed() : mr == 2 ? Tiles<2>::packed() : Tiles<1>::packed();
  for (int c0 = 0; c0 < nr; c0 += sub)
    fn(x, ldx, wp + c0 * 16, kc, std::min(sub, nr - c0), y + c0, ldy, first, bias ? bias + c0 : nullptr);
}

// The same for W read in place: a full group (with the prefetch of the next one), or the
// partial last group of a thread's share.
template <DType T>
void in_place_group(int64_t mr, const float* x, int64_t ldx, const uint8_t* w, int64_t ld, int64_t kc, int nr, float* y,
                    int64_t ldy, bool first, const float* bias, const char* prefetch, int64_t prefetch_lines) {
  const int sub = sub_rows(mr);
  for (int c0 = 0; c0 < nr; c0 += sub) {
    const uint8_t* wc = w + c0 * row_bytes<T>(ld);
    const float* bc = bias ? bias + c0 : nullptr;
    if (nr - c0 >= sub) {
      const int64_t lines = c0 == 0 ? prefetch_lines : 0;  // the first tile issues the group's share
      const InPlaceTileFn<T> fn = mr == 3   ? Tiles<3>::template in_place<T>()
                                  : mr == 2 ? Tiles<2>::template in_place<T>()
                                            : Tiles<1>::template in_place<T>();
      fn(x, ldx, wc, ld, kc, y + c0, ldy, first, bc, prefetch, lines);
    } else {
      const PartialTileFn<T> fn = mr == 3   ? Tiles<3>::template partial<T>()
                                  : mr == 2 ? Tiles<2>::template partial<T>()
                                            : Tiles<1>::template partial<T>();
      fn(x, ldx, wc, ld, kc, nr - c0, y + c0, ldy, first, bc);
    }
  }
}

// One row of x (decode) against float W read in place: the thread's share of rows [r0, r1) cut
// in two halves, row j of the first half read together with row j of the second (dot_rows over
// two rows half a share apart), each over its whole K. That makes two sequential streams of W
// per thread, and two independent accumulator chains: one row's 16 lanes are a chain of
// dependent FMAs, so one row at a time waits on FMA latency where W is in cache, and rows next
// to each other (the 4- and 8-row tiles) read memory as many short streams. The operations per
// output are the generic level's, so the bits are too. One decode step's products of the 100M
// model (49 matrices; the ways alternating call by call in one process through a temporary
// switch; AMD EPYC Zen 5, 2 vCPUs), against the tiles (v3 f32: its earlier 4 adjacent rows):
// cold weights, two threads 1.15-1.26x (f32, bf16, f16; v4 f16 1.03x), one thread 1.29-1.44x;
// one layer's weights (in L3) 1.14-1.40x; faster in 18-20 of every 20 rounds (v4 f16 cold: 12)
// (performance.md, "2026-12-08"). One row at a time: 0.85-1.27x the tiles; four far-apart rows:
// 0.89-1.26x two.
template <DType T>
void gemv_rows(const float* x, const uint8_t* w, int64_t kk, int64_t r0, int64_t r1, const float* bias, float* y) {
  const int64_t half = (r1 - r0) / 2, rb = row_bytes<T>(kk);
  for (int64_t j = r0; j < r0 + half; ++j) {
    float s[2];
    dot_rows<2, T>(x, w + j * rb, half * rb, kk, s);
    y[j] = bias ? s[0] + bias[j] : s[0];
    y[j + half] = bias ? s[1] + bias[j + half] : s[1];
  }
  if (const int64_t j = r0 + 2 * half; j < r1) {  // an odd share's last row
    float s;
    dot_rows<1, T>(x, w + j * rb, rb, kk, &s);
    y[j] = bias ? s + bias[j] : s;
  }
}

template <DType T>
void linear_invariant(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  const int64_t n = w.rows, kk = w.cols;
  const uint8_t* wb = static_cast<const uint8_t*>(w.data);
  const bool pack = m > (T == DType::kF32 && kF32BatchesInPlace ? kL1PackM : kSmallM);
  const int64_t groups = (n + kGroup - 1) / kGroup;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    // A contiguous share of whole groups per thread (the partition never affects values).
    const int64_t r0 = std::min(n, groups * t / nt * kGroup), r1 = std::min(n, groups * (t + 1) / nt * kGroup);
    if (m == 1 && kDecodeInRows && (T == DType::kF32 || T == DType::kBF16 || T == DType::kF16)) {
      gemv_rows<T>(x, wb, kk, r0, r1, bias, y);
    } else if (!pack) {
      const int64_t tiles = num_tiles(m);
      // Decode (and f32 decode batches): W read in place, a group of rows at a time over the
      // whole K; every row tile of x passes over each group x kKb block while it is in L1.
      for (int64_t j = r0; j < r1; j += kGroup) {
        const int nr = static_cast<int>(std::min<int64_t>(kGroup, r1 - j));
        for (int64_t k0 = 0; k0 < kk; k0 += kKb) {
          const int64_t kc = std::min(kKb, kk - k0);
          const bool first = k0 == 0, last = k0 + kc == kk;
          const float* bj = last && bias ? bias + j : nullptr;
          // The next group (contiguous, kGroup * kk elements further) is prefetched while this
          // one is computed, its share for this K block spread evenly over the row tiles:
          // short rows keep the hardware prefetchers from ramping up on each group's streams,
          // and a burst of requests would stall the tile that issues it.
          const bool pf = j + 2 * kGroup <= r1;
          const char* next = reinterpret_cast<const char*>(wb + (j + kGroup) * row_bytes<T>(kk) + kGroup * row_bytes<T>(k0));
          const int64_t lines = kGroup * row_bytes<T>(kc) / 64;
          for (int64_t i = 0, ti = 0; i < m; ++ti) {
            const int64_t mr = tile_rows(m - i);
            const int64_t l0 = lines * ti / tiles, l1 = lines * (ti + 1) / tiles;
            in_place_group<T>(mr, x + i * kk + k0, kk, wb + j * row_bytes<T>(kk) + row_bytes<T>(k0), kk, kc, nr, y + i * n + j, n, first, bj,
                              pf ? next + l0 * 64 : nullptr, pf ? l1 - l0 : 0);
            i += mr;
          }
        }
      }
    } else if (m <= kL1PackM) {
      // Decode batches: each group of W rows x kKb is widened once into an L1-resident buffer
      // that every row tile of x reuses. Groups go one at a time over the whole K, so W is read
      // as sequential streams, and the next group's rows (contiguous in memory) are prefetched
      // a K block at a time, spread over the row tiles, as in the in-place path.
      alignas(64) float small[kGroup * kKb];
      for (int64_t j = r0; j < r1; j += kGroup) {
        const int nr = static_cast<int>(std::min<int64_t>(kGroup, r1 - j));
        const char* next =
            j + 2 * kGroup <= r1 ? reinterpret_cast<const char*>(wb + (j + kGroup) * row_bytes<T>(kk)) : nullptr;
        for (int64_t k0 = 0; k0 < kk; k0 += kKb) {
          const int64_t kc = std::min(kKb, kk - k0);
          const bool first = k0 == 0, last = k0 + kc == kk;
          const float* bj = last && bias ? bias + j : nullptr;
          pack_block<T>(wb + j * row_bytes<T>(kk), kk, nr, k0, kc, small);
          // The next group's share for this K block goes out spread over the row tiles, as in
          // the in-place path, not in one burst ahead of the first tile (384 lines at K = 768,
          // f32; a burst can fill the core's queue of misses while that tile runs). Products of
          // one decode step of the 100M model, 32 rows, alternating in one process (AMD EPYC
          // Zen 5, 2 threads): f32 v3 1.06-1.11x, bf16 v3 1.15x, bf16 v4 1.19x (faster in 14-20
          // of every 16-20 rounds).
          const int64_t tiles = num_tiles(m), lines = kGroup * row_bytes<T>(kc) / 64;
          const char* pf = next ? next + kGroup * row_bytes<T>(k0) : nullptr;
          for (int64_t i = 0, mr, ti = 0; i < m; i += mr, ++ti) {
            mr = tile_rows(m - i);
            if (pf) {
              for (int64_t l = lines * ti / tiles; l < lines * (ti + 1) / tiles; ++l) prefetch_l2(pf + l * 64);
            }
            packed_group(mr, x + i * kk + k0, kk, small, kc, nr, y + i * n + j, n, first, bj);
          }
        }
      }
    } else {
      const bool in_l1 = group_in_l1();
      thread_local std::vector<float> packed;
      if (r0 < r1) packed.resize(static_cast<size_t>(kBlockRows * kKb));
      // Each (W block, K block) is packed once, before the first of the row blocks under it
      // (for_each_block's order); packing per row block read W from memory again each time.
      for_each_block(r0, r1, m, kk, [&](int64_t nb0, int64_t nb1, int64_t mb0, int64_t mb1, int64_t k0, int64_t kc) {
        const bool first = k0 == 0, last = k0 + kc == kk;
        if (mb0 == 0) pack_block<T>(wb + nb0 * row_bytes<T>(kk), kk, nb1 - nb0, k0, kc, packed.data());
        const int64_t steps = (kc + 15) / 16;
        // The tiles of mr rows from row i against group j.
        const auto group_tiles = [&](int64_t i, int64_t mr, int64_t j) {
          const int nr = static_cast<int>(std::min<int64_t>(kGroup, nb1 - j));
          packed_group(mr, x + i * kk + k0, kk, packed.data() + (j - nb0) * steps * 16, kc, nr, y + i * n + j, n,
                       first, last && bias ? bias + j : nullptr);
        };
        if (!in_l1) {  // each row tile over the whole block (3 x 8 tiles reuse W from L2)
          for (int64_t i = mb0, mr; i < mb1; i += mr) {
            mr = tile_rows(mb1 - i);
            for (int64_t j = nb0; j < nb1; j += kGroup) group_tiles(i, mr, j);
          }
        } else {  // each group in turn, hot in L1, under the row tiles of kL1RowBlock rows
          for (int64_t sb0 = mb0; sb0 < mb1; sb0 += kL1RowBlock) {
            const int64_t sb1 = std::min(mb1, sb0 + kL1RowBlock);
            for (int64_t j = nb0; j < nb1; j += kGroup)
              for (int64_t i = sb0, mr; i < sb1; i += mr) {
                mr = tile_rows(sb1 - i);
                group_tiles(i, mr, j);
              }
          }
        }
      });
    }
  }
}

#endif

// dst[k] = float(src[k]) for k < count (exact for bf16, f16, Q8_0, Q4_0 and Q6_K; Q4_K and Q5_K as
// dequantized).
template <DType T>
void widen(const void* src, int64_t count, float* dst) {
  const uint8_t* s = static_cast<const uint8_t*>(src);
  int64_t k = 0;
  for (; k + 16 <= count; k += 16) vstore(dst + k, load_w_at<T>(s, k));
  if constexpr (!kBlockType<T>) {
    if (k < count) vstore(dst + k, load_w<T>(s + k * kElemBytes<T>, count - k), count - k);
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
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + j0 * row_bytes<T>(kk);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < nr; ++r) widen<T>(src + r * row_bytes<T>(kk), kk, wf.data() + r * kk);
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
  if (!batch_invariant() && m >= kBlasMinRows) return linear_blas<T>(x, m, w, bias, y);
  linear_invariant<T>(x, m, w, bias, y);
}

}  // namespace

void linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  ASTRAI_CHECK(m >= 0 && w.rows >= 0 && w.cols >= 0, "linear: negative shape");
  if (m == 0 || w.rows == 0) return;
  switch (w.dtype) {
    case DType::kF32: return linear_typed<DType::kF32>(x, m, w, bias, y);
    case DType::kBF16:
      if (bf16_dot() && w.cols > 0) return linear_bf16_dot(x, m, w, bias, y);
      return linear_typed<DType::kBF16>(x, m, w, bias, y);
    case DType::kF16: return linear_typed<DType::kF16>(x, m, w, bias, y);
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      ASTRAI_CHECK(w.cols % block_elems(w.dtype) == 0, "linear: ", dtype_name(w.dtype),
                   " weights need whole blocks of ", block_elems(w.dtype), " (cols ", w.cols, ")");
      if (activations() == Activations::kQ8) return linear_int8(x, m, w, bias, y);
      if (w.dtype == DType::kQ8_0) return linear_typed<DType::kQ8_0>(x, m, w, bias, y);
      if (w.dtype == DType::kQ4_0) return linear_typed<DType::kQ4_0>(x, m, w, bias, y);
      if (w.dtype == DType::kQ4_K) return linear_typed<DType::kQ4_K>(x, m, w, bias, y);
      if (w.dtype == DType::kQ5_K) return linear_typed<DType::kQ5_K>(x, m, w, bias, y);
      return linear_typed<DType::kQ6_K>(x, m, w, bias, y);
    default: fail("linear: unsupported weight dtype ", dtype_name(w.dtype));
  }
}

namespace {
// Whether linear() would give out the 8-bit activation product, with x quantized as for first.
bool joins_int8_group(const LinearOut& out, const LinearOut& first) {
  const DType t = out.w.dtype;
  return is_block_type(t) && out.w.cols == first.w.cols && out.w.cols % block_elems(t) == 0 &&
         block_elems(t) == block_elems(first.w.dtype);
}
}  // namespace

void linear_group(const float* x, int64_t m, const LinearOut* outs, int64_t n) {
  if (m == 0) return;
  bool one_job = n > 1 && activations() == Activations::kQ8;
  for (int64_t o = 0; one_job && o < n; ++o) one_job = joins_int8_group(outs[o], outs[0]);
  if (one_job) return linear_int8_group(x, m, outs, n);
  for (int64_t o = 0; o < n; ++o) (linear)(x, m, outs[o].w, outs[o].bias, outs[o].y);  // this level's (no ADL)
}

void fill_linear(KernelTable& t) {
  t.linear = &linear;
  t.linear_group = &linear_group;
  t.bf16_dot_native = &bf16_dot_native;
}

ASTRAI_KERNELS_END
