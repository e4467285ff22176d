// linear_bf16_dot: bf16 weights times bf16-rounded activations, VDPBF16PS's arithmetic
// (definition in linear_bf16.h). Every level has the emulated form (f32 fused multiply-adds and
// the instruction's flushes of denormals); v4 adds register tiles of VDPBF16PS, used where the
// CPU has AVX512_BF16 and the instruction passes the check at first use.
//
// The emulated form splits each K block of 4 W rows into f32 pairs once (in L1) for every row of
// x and interleaves the 4 outputs' chains: on the Zen 5 forced to v3, 36-38 GFLOP/s at 512 rows
// on one thread, a third of the default mode's 94-117.
//
// The tiles (v4): up to 3 rows of x x 8 rows of W (24 zmm accumulators), both operands read in
// place as bf16, 32 elements per zmm: a step is 3 + 8 loads and 24 VDPBF16PS, twice the
// products of the f32 tile's step for the same registers. Few rows (decode): a group of 8 W
// rows at a time over the whole K, the next group prefetched, as linear()'s in-place path. Many
// rows: linear()'s blocks (for_each_block in linear_tile.h), each group of 8 W rows (16 KiB,
// in L1) under every row tile of the x block (in L2).
#include "kernels/cpu/linear_bf16.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/rng.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_tile.h"
#include "kernels/cpu/simd.h"
#include "tensor/dtype.h"

ASTRAI_KERNELS_BEGIN

namespace {

constexpr int64_t kPair = 32;  // K elements per step of the 16 lanes (a pair each)

int64_t padded(int64_t k) { return (k + kPair - 1) / kPair * kPair; }

// A row of x (k elements) rounded to bf16 into out: kp = padded(k) elements, zero past k.
void round_row(const float* x, int64_t k, int64_t kp, uint16_t* out) {
  for (int64_t e = 0; e < k; ++e) out[e] = f32_to_bf16(x[e]);
  for (int64_t e = k; e < kp; ++e) out[e] = 0;
}

// ---- The definition emulated with f32 fused multiply-adds (every level; the reference) ----

// A result as the instruction writes it: a denormal is a zero of its sign.
inline float ftz(float a) { return std::fabs(a) < FLT_MIN ? std::copysign(0.0f, a) : a; }

// The 16 pairs of bf16 at p as f32, their even elements into even[], odd into odd[], a denormal
// read as a zero of its sign (as the instruction reads its operands). Bit operations only, so
// the compiler vectorises it.
inline void split_pairs(const uint16_t* p, float* even, float* odd) {
  uint32_t u[kLanes], e[kLanes], o[kLanes];
  std::memcpy(u, p, sizeof u);
#pragma GCC ivdep
  for (int l = 0; l < kLanes; ++l) {
    const uint32_t el = u[l] << 16, ol = u[l] & 0xffff0000u;
    // All ones where the exponent is not zero, else the sign bit alone.
    e[l] = el & ((0u - static_cast<uint32_t>((el & 0x7f800000u) != 0)) | 0x80000000u);
    o[l] = ol & ((0u - static_cast<uint32_t>((ol & 0x7f800000u) != 0)) | 0x80000000u);
  }
  std::memcpy(even, e, sizeof e);
  std::memcpy(odd, o, sizeof o);
}

constexpr int kEmulatedRows = 4;  // W rows split once per K block for every row of x

// The lane sums of kEmulatedRows outputs over a block of `chunks` steps, tree-summed into p; x
// and w as split_pairs gives them (16 even and 16 odd elements per step, zero past the block's
// end; W rows kKb / 2 apart). The outputs' chains interleave, so they overlap in the pipeline.
void block_dots(const float* xe, const float* xo, const float (*we)[kKb / 2], const float (*wo)[kKb / 2],
                int64_t chunks, float* p) {
  alignas(64) float a[kEmulatedRows][kLanes] = {};
  for (int64_t c = 0; c < chunks * kLanes; c += kLanes) {
    for (int r = 0; r < kEmulatedRows; ++r)
      for (int l = 0; l < kLanes; ++l) a[r][l] = ftz(std::fma(xo[c + l], wo[r][c + l], a[r][l]));
    for (int r = 0; r < kEmulatedRows; ++r)
      for (int l = 0; l < kLanes; ++l) a[r][l] = ftz(std::fma(xe[c + l], we[r][c + l], a[r][l]));
  }
  for (int r = 0; r < kEmulatedRows; ++r) p[r] = vsum(vload(a[r]));
}

// Outputs [j0, j1) of every row (called by each thread of a parallel region with its share);
// xe / xo: each row's pairs split (kp / 2 apart). A few W rows at a time, each K block of them
// split into pairs once (in L1) for all the rows of x.
void outputs_emulated(const float* xe, const float* xo, int64_t kp, int64_t m, const uint16_t* w, int64_t kk,
                      const float* bias, float* y, int64_t n, int64_t j0, int64_t j1) {
  alignas(64) float we[kEmulatedRows][kKb / 2] = {}, wo[kEmulatedRows][kKb / 2] = {};
  for (int64_t j = j0; j < j1; j += kEmulatedRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kEmulatedRows, j1 - j));
    for (int64_t k0 = 0; k0 < kk; k0 += kKb) {
      const int64_t kc = std::min(kKb, kk - k0), chunks = padded(kc) / kPair;
      for (int r = 0; r < nr; ++r) {
        const uint16_t* wr = w + (j + r) * kk + k0;
        for (int64_t c = 0; c < chunks; ++c) {
          uint16_t part[kPair] = {};  // zero past the block's end
          std::memcpy(part, wr + c * kPair, static_cast<size_t>(std::min(kPair, kc - c * kPair)) * 2);
          split_pairs(part, we[r] + c * kLanes, wo[r] + c * kLanes);
        }
      }
      const bool first = k0 == 0, last = k0 + kc == kk;
      for (int64_t i = 0; i < m; ++i) {
        float p[kEmulatedRows];
        block_dots(xe + i * kp / 2 + k0 / 2, xo + i * kp / 2 + k0 / 2, we, wo, chunks, p);
        for (int r = 0; r < nr; ++r) {
          float& out = y[i * n + j + r];
          out = first ? p[r] : out + p[r];
          if (last && bias) out = out + bias[j + r];
        }
      }
    }
  }
}

// A rounded row of x (kp elements) split into pairs for outputs_emulated. W rows past nr in
// outputs_emulated's buffers hold an earlier group's pairs: computed, never stored.
void split_row(const uint16_t* xb, int64_t kp, float* xe, float* xo) {
  for (int64_t c = 0; c < kp; c += kPair) split_pairs(xb + c, xe + c / 2, xo + c / 2);
}

#if defined(ASTRAI_ISA_V4)

constexpr int64_t kSmallM = 8;       // up to this many rows: a group of W rows at a time over the whole K

ASTRAI_PRAGMA(GCC push_options)
ASTRAI_PRAGMA(GCC target("avx512bf16"))
namespace bf16dot {  // the only functions holding VDPBF16PS (scripts/check-isa.py)

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

// One step of a tile: acc[r][c] += the 32 elements of x row r (at x, ldx apart) against those of
// W row c (wload(c)), each W vector loaded once for the MR rows.
template <int MR, int NR, typename WLoad>
[[gnu::always_inline]] inline void dp_step(const uint16_t* x, int64_t ldx, WLoad&& wload, Vec16 (&acc)[MR][NR]) {
  __m512i xv[MR];
#pragma GCC unroll 3
  for (int r = 0; r < MR; ++r) xv[r] = _mm512_loadu_si512(x + r * ldx);
#pragma GCC unroll 8
  for (int c = 0; c < NR; ++c) {
    const __m512i wv = wload(c);
#pragma GCC unroll 3
    for (int r = 0; r < MR; ++r) acc[r][c].v = _mm512_dpbf16_ps(acc[r][c].v, as_bh(xv[r]), as_bh(wv));
  }
}

// MR rows of x (ldx apart) x 8 rows of W (ldw apart; rows past nr alias row nr - 1) over one K
// block of kc elements; the block's sums added to y in the definition's order. The W rows are
// addressed from three pointers (rows 0-2, 3-5, 6-7) and one stride, as linear()'s in-place
// tile does, so they stay in registers. `prefetch_lines` cache lines from `prefetch` (may be
// null) are requested into L2, spread over the steps.
template <int MR>
void tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t kc, int nr, float* y, int64_t ldy,
          bool first, const float* bias, const char* prefetch, int64_t prefetch_lines) {
  constexpr int NR = 8;
  Vec16 acc[MR][NR];
  zero_tile(acc);
  const auto row = [&](int c) { return w + std::min(c, nr - 1) * ldw; };
  if (nr == NR) {
    const uint16_t* base[3] = {w, w + 3 * ldw, w + 6 * ldw};
    const int64_t steps = kc / kPair;
    const int64_t pf_step = prefetch ? (prefetch_lines + std::max<int64_t>(1, steps) - 1) / std::max<int64_t>(1, steps) : 0;
    const char* pf = prefetch;
    const char* pf_end = prefetch ? prefetch + prefetch_lines * 64 : nullptr;
    const uint16_t* xr = x;
    for (int64_t i = 0; i < steps; ++i) {
      if (pf < pf_end) {
        for (int64_t b = 0; b < pf_step; ++b) prefetch_l2(pf + b * 64);
        pf += pf_step * 64;
      }
      dp_step(xr, ldx, [&](int c) { return _mm512_loadu_si512(c % 3 == 0 ? base[c / 3] : base[c / 3] + (c % 3) * ldw); },
              acc);
      for (int b = 0; b < 3; ++b) base[b] += kPair;
      xr += kPair;
    }
  } else {
    for (int64_t k = 0; k + kPair <= kc; k += kPair)
      dp_step(x + k, ldx, [&](int c) { return _mm512_loadu_si512(row(c) + k); }, acc);
  }
  const int64_t k = kc / kPair * kPair;
  if (k < kc) {  // the tail: x is zero there already, W masked to zero
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (kc - k)) - 1);
    dp_step(x + k, ldx, [&](int c) { return _mm512_maskz_loadu_epi16(mask, row(c) + k); }, acc);
  }
  tile_store<MR, NR>(acc, nr, y, ldy, first, bias);
}

// Rows [i0, i1) of x against the group of nr W rows at w, over the K block [k0, k0 + kc);
// `lines` cache lines from `prefetch` (may be null) spread evenly over the row tiles.
void group_rows(const uint16_t* xb, int64_t kp, int64_t i0, int64_t i1, const uint16_t* w, int64_t kk, int nr,
                int64_t k0, int64_t kc, float* y, int64_t n, const float* bias, const char* prefetch = nullptr,
                int64_t lines = 0) {
  const bool first = k0 == 0;
  const float* b = k0 + kc == kk ? bias : nullptr;
  const int64_t tiles = num_tiles(i1 - i0);
  for (int64_t i = i0, mr, ti = 0; i < i1; i += mr, ++ti) {
    mr = tile_rows(i1 - i);
    const uint16_t* xi = xb + i * kp + k0;
    float* yi = y + i * n;
    const int64_t l0 = lines * ti / tiles, l1 = lines * (ti + 1) / tiles;
    const char* p = prefetch ? prefetch + l0 * 64 : nullptr;
    if (mr == 3) tile<3>(xi, kp, w + k0, kk, kc, nr, yi, n, first, b, p, l1 - l0);
    else if (mr == 2) tile<2>(xi, kp, w + k0, kk, kc, nr, yi, n, first, b, p, l1 - l0);
    else tile<1>(xi, kp, w + k0, kk, kc, nr, yi, n, first, b, p, l1 - l0);
  }
}

// W rows [r0, r1) (whole groups but the last) for every row of x.
void outputs(const uint16_t* xb, int64_t kp, int64_t m, const uint16_t* w, int64_t kk, const float* bias, float* y,
             int64_t n, int64_t r0, int64_t r1) {
  if (m <= kSmallM) {
    for (int64_t j = r0; j < r1; j += kGroup) {
      const int nr = static_cast<int>(std::min<int64_t>(kGroup, r1 - j));
      // The next group's rows (contiguous, after these) prefetched in K blocks' shares.
      const bool pf = j + 2 * kGroup <= r1;
      for (int64_t k0 = 0; k0 < kk; k0 += kKb) {
        const int64_t kc = std::min(kKb, kk - k0);
        const char* next = reinterpret_cast<const char*>(w + (j + kGroup) * kk + kGroup * k0);
        group_rows(xb, kp, 0, m, w + j * kk, kk, nr, k0, kc, y + j, n, bias ? bias + j : nullptr, pf ? next : nullptr,
                   pf ? kGroup * kc * 2 / 64 : 0);
      }
    }
    return;
  }
  for_each_block(r0, r1, m, kk, [&](int64_t nb0, int64_t nb1, int64_t mb0, int64_t mb1, int64_t k0, int64_t kc) {
    for (int64_t j = nb0; j < nb1; j += kGroup) {
      const int nr = static_cast<int>(std::min<int64_t>(kGroup, nb1 - j));
      group_rows(xb, kp, mb0, mb1, w + j * kk, kk, nr, k0, kc, y + j, n, bias ? bias + j : nullptr);
    }
  });
}

}  // namespace bf16dot
ASTRAI_PRAGMA(GCC pop_options)

// The instruction against the definition on fixed inputs: normal values over a wide range of
// exponents, denormals, zeros of both signs, a K tail; 3 rows x 8 outputs, where row 1 against
// outputs 4-7 sums products near and below the smallest normal f32 (flushed or not).
bool native_matches_definition() {
  constexpr int64_t m = 3, n = 8, k = 1100;  // two K blocks, the second with a tail
  std::vector<float> x(m * k);
  std::vector<uint16_t> w(n * k), xb(m * padded(k));
  SplitMix64 rng(1);
  // A bf16 of exponent 2^(centre +- range), or (1 in 16) a zero or denormal.
  const auto value = [&rng](int centre, int range) {
    const uint64_t r = rng.next();
    const int e = r % 16 == 0 ? 0 : 127 + centre - range + static_cast<int>((r >> 4) % (2 * range));
    return static_cast<uint16_t>(((r >> 20) & 1) << 15 | static_cast<uint32_t>(e) << 7 | ((r >> 24) & 127));
  };
  for (int64_t e = 0; e < n * k; ++e) w[e] = e / k < 4 ? value(0, 60) : value(-70, 6);
  for (int64_t e = 0; e < m * k; ++e)
    x[e] = bf16_to_f32(e / k == 1 ? value(-70, 6) : value(0, 60)) * (1.0f + static_cast<float>(rng.below(256)) / 512.0f);
  const int64_t kp = padded(k);
  std::vector<float> native(m * n), ref(m * n), xe(m * kp / 2), xo(xe.size());
  for (int64_t i = 0; i < m; ++i) {
    round_row(x.data() + i * k, k, kp, xb.data() + i * kp);
    split_row(xb.data() + i * kp, kp, xe.data() + i * kp / 2, xo.data() + i * kp / 2);
  }
  bf16dot::outputs(xb.data(), kp, m, w.data(), k, nullptr, native.data(), n, 0, n);
  outputs_emulated(xe.data(), xo.data(), kp, m, w.data(), k, nullptr, ref.data(), n, 0, n);
  return std::memcmp(native.data(), ref.data(), native.size() * sizeof(float)) == 0;
}

bool native_available() {
  if (!cpu_has("avx512_bf16")) return false;
  if (native_matches_definition()) return true;
  log_warn("this CPU's VDPBF16PS differs from the bf16-dot definition; bf16 dot products are emulated");
  return false;
}

#endif

}  // namespace

bool bf16_dot_native() {
#if defined(ASTRAI_ISA_V4)
  static const bool native = native_available();
  return native;
#else
  return false;
#endif
}

void linear_bf16_dot(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  ASTRAI_CHECK(w.dtype == DType::kBF16, "linear_bf16_dot: weights are ", dtype_name(w.dtype), ", not BF16");
  const int64_t n = w.rows, kk = w.cols, kp = padded(kk);
  const bool native = bf16_dot_native();
  if (!native) {
    static const bool said = [] {
      log_warn("--bf16-dot: no AVX512_BF16 at this CPU level; the same results are computed emulated, slower than "
               "without --bf16-dot");
      return true;
    }();
    (void)said;
  }
  // The rounded rows (and, emulated, their pairs split): one buffer per calling thread, grown,
  // never shrunk.
  thread_local std::vector<uint16_t> rows;
  thread_local std::vector<float> pairs;
  if (rows.size() < static_cast<size_t>(m * kp)) rows.resize(static_cast<size_t>(m * kp));
  if (!native && pairs.size() < static_cast<size_t>(m * kp)) pairs.resize(static_cast<size_t>(m * kp));
  uint16_t* xb = rows.data();
  float* xe = pairs.data();
  float* xo = native ? nullptr : xe + m * kp / 2;
  const uint16_t* wb = static_cast<const uint16_t*>(w.data);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      round_row(x + i * kk, kk, kp, xb + i * kp);
      if (!native) split_row(xb + i * kp, kp, xe + i * kp / 2, xo + i * kp / 2);
    }
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    // A contiguous share of whole groups of W rows per thread (never affects values).
    const int64_t groups = (n + kGroup - 1) / kGroup;
    const int64_t r0 = std::min(n, groups * t / nt * kGroup), r1 = std::min(n, groups * (t + 1) / nt * kGroup);
#if defined(ASTRAI_ISA_V4)
    if (native) {
      if (r0 < r1) bf16dot::outputs(xb, kp, m, wb, kk, bias, y, n, r0, r1);
    } else {
      outputs_emulated(xe, xo, kp, m, wb, kk, bias, y, n, r0, r1);
    }
#else
    outputs_emulated(xe, xo, kp, m, wb, kk, bias, y, n, r0, r1);
#endif
  }
}

ASTRAI_KERNELS_END
