#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/level_table.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

namespace {

// Up to this many consecutive new tokens of one sequence share each K/V row read (prefill):
// the rows come from L2 once per block instead of once per token.
constexpr int64_t kTokenBlock = 4;
// Key positions per chunk of the online softmax, by absolute position: a chunk's scores
// stay in L1 between the score, softmax and V steps.
constexpr int64_t kChunk = 64;

// The K/V rows of one chunk's positions: runs of consecutive positions, one per page (or one
// for the batch's own rows), rows `stride` elements apart.
template <typename E>
struct KvRun {
  int64_t p0, n;  // positions [p0, p0 + n)
  int64_t page;   // index in the page table (paged mode)
  const E* k;     // the K row of p0
  const E* v;     // the V row of p0
};

// The V pass: weighted sums of V rows for R query rows at once, over every run of a chunk
// between one load and one store of the accumulators (a store and a reload per page cost more
// than the page's arithmetic: zmm stores do not forward to the next loads). Key position j
// goes to the even or odd set of a row's accumulators by its parity, so consecutive keys form
// independent FMA chains; the sets are kept in the row's acc ([even: nv][odd: nv] Vec16s)
// between chunks and added at the end. Each V vector is loaded once for the R rows. Storing and
// reloading f32 is exact and a row's operations do not depend on the rows beside it, so the
// result depends only on the positions, never on how they were split into runs, chunks of
// dims or groups of rows. Dims go in chunks of at most kPvMaxNv Vec16s so the accumulators of R
// rows stay in registers:
//   v4: 8 (2 x 8 x R zmm; R = 3 up to 4 Vec16s, 2 up to 7, else 1);
//   v3 and neon: 3 for one row (12 ymm / 24 q); generic: 8, one row.
// v3 goes by parts of 8 dims instead where that measured faster (pv_runs_parts below).
#if defined(ASTRAI_ISA_V4)
constexpr int64_t kPvMaxNv = 8;
constexpr int pv_rows(int64_t nv) { return 2 * nv * 3 + 4 <= 32 ? 3 : 2 * nv * 2 + 4 <= 32 ? 2 : 1; }
#elif defined(ASTRAI_ISA_GENERIC)
constexpr int64_t kPvMaxNv = 8;
constexpr int pv_rows(int64_t) { return 1; }
#else
constexpr int64_t kPvMaxNv = 3;
constexpr int pv_rows(int64_t) { return 1; }
#endif

template <int NV, int R, typename E>
inline void pv_key(const float* const* p, int64_t i, const E* row, int64_t last_n, Vec16 (*acc)[NV]) {
  Vec16 pv[R];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r) pv[r] = Vec16(p[r][i]);
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    const Vec16 v = j < NV - 1 ? vload_elem(row + 16 * j) : vload_elem_n(row + 16 * j, last_n);
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) acc[r][j] = vfma(pv[r], v, acc[r][j]);
  }
}

// Positions [begin, end) of the runs (scores p[r] from the chunk's first position c0; V rows
// `stride` apart, from Vec16 j0 of dims, the last of the NV holding last_n dims) into the
// accumulators acc[r] + 16 * j0 (even set) and + odd (odd set).
template <int NV, int R, typename E>
void pv_runs(const float* const* p, int64_t c0, const KvRun<E>* runs, int64_t nruns, int64_t begin, int64_t end,
             int64_t stride, int64_t j0, int64_t last_n, float* const* acc, int64_t odd) {
  Vec16 even[R][NV], odds[R][NV];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      even[r][j] = vload(acc[r] + 16 * (j0 + j));
      odds[r][j] = vload(acc[r] + odd + 16 * (j0 + j));
    }
  for (int64_t k = 0; k < nruns; ++k) {
    const int64_t lo = std::max(runs[k].p0, begin), hi = std::min(runs[k].p0 + runs[k].n, end);
    if (lo >= hi) continue;
    const E* vr = runs[k].v + (lo - runs[k].p0) * stride + 16 * j0;
    const float* pr[R];
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) pr[r] = p[r] + (lo - c0);
    const int64_t n = hi - lo;
    int64_t i = 0;
    if (lo & 1) {
      pv_key<NV, R, E>(pr, 0, vr, last_n, odds);
      i = 1;
    }
    const E* v = vr + i * stride;  // advanced by a pointer, as in pv_runs_parts
    for (; i + 1 < n; i += 2, v += 2 * stride) {
      pv_key<NV, R, E>(pr, i, v, last_n, even);
      pv_key<NV, R, E>(pr, i + 1, v + stride, last_n, odds);
    }
    if (i < n) pv_key<NV, R, E>(pr, i, v, last_n, even);
  }
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      vstore(acc[r] + 16 * (j0 + j), even[r][j]);
      vstore(acc[r] + odd + 16 * (j0 + j), odds[r][j]);
    }
}

template <typename E>
using PvRunsFn = void (*)(const float* const*, int64_t, const KvRun<E>*, int64_t, int64_t, int64_t, int64_t, int64_t,
                          int64_t, float* const*, int64_t);

template <int NV, typename E>
PvRunsFn<E> pv_runs_for(int64_t rows) {
  if constexpr (NV > kPvMaxNv) {
    return nullptr;
  } else {
    if (rows >= 3 && pv_rows(NV) >= 3) return &pv_runs<NV, (pv_rows(NV) >= 3 ? 3 : 1), E>;
    if (rows >= 2 && pv_rows(NV) >= 2) return &pv_runs<NV, (pv_rows(NV) >= 2 ? 2 : 1), E>;
    return &pv_runs<NV, 1, E>;
  }
}

// The V-pass kernel for a chunk of nv (<= kPvMaxNv) Vec16s of dims and up to `rows` rows.
template <typename E>
PvRunsFn<E> pv_runs_fn(int64_t nv, int64_t rows) {
  switch (nv) {
    case 1: return pv_runs_for<1, E>(rows);
    case 2: return pv_runs_for<2, E>(rows);
    case 3: return pv_runs_for<3, E>(rows);
    case 4: return pv_runs_for<4, E>(rows);
    case 5: return pv_runs_for<5, E>(rows);
    case 6: return pv_runs_for<6, E>(rows);
    case 7: return pv_runs_for<7, E>(rows);
    default: return pv_runs_for<8, E>(rows);
  }
}

#if defined(ASTRAI_ISA_V3)
// v3, v_dim a multiple of 8 (work items: see by_parts in attend_block): the V pass by parts (8
// dims, one ymm): each dim's lane is an independent chain, so R = 3 rows x P <= 2 parts (12
// ymm accumulators, even and odd sets; 2 rows x 3 parts, 1 x 3 for the rest) share each V load
// and each broadcast weight, over all the runs of a chunk as pv_runs. Same operations per lane
// as pv_runs.
constexpr int64_t kPartRows = 3;
// Parts per pass for R rows: R x P x 2 accumulators + R broadcasts + the V part <= 16 ymm.
constexpr int64_t parts_per_pass(int64_t rows) { return rows >= 3 ? 2 : 3; }

template <int P, int R, typename E>
inline void pv_key_parts(const float* const* p, int64_t i, const E* row, __m256 (*acc)[P]) {
  __m256 pv[R];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r) pv[r] = _mm256_broadcast_ss(p[r] + i);
#pragma GCC unroll 3
  for (int j = 0; j < P; ++j) {
    __m256 v = pload_elem(row + 8 * j, 0);
    if constexpr (R > 1) asm("" : "+x"(v));  // one load for the R FMAs (GCC would fold it into each of them)
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(pv[r], v, acc[r][j]);
  }
}

// Positions [begin, end) of the runs (scores p[r] from the chunk's first position c0; V rows
// `stride` apart, from dim 8 * j0).
template <int P, int R, typename E>
void pv_runs_parts(const float* const* p, int64_t c0, const KvRun<E>* runs, int64_t nruns, int64_t begin, int64_t end,
                   int64_t stride, int64_t j0, float* const* acc, int64_t odd) {
  __m256 even[R][P], odds[R][P];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < P; ++j) {
      even[r][j] = _mm256_loadu_ps(acc[r] + 8 * (j0 + j));
      odds[r][j] = _mm256_loadu_ps(acc[r] + odd + 8 * (j0 + j));
    }
  for (int64_t k = 0; k < nruns; ++k) {
    const int64_t lo = std::max(runs[k].p0, begin), hi = std::min(runs[k].p0 + runs[k].n, end);
    if (lo >= hi) continue;
    const E* vr = runs[k].v + (lo - runs[k].p0) * stride + 8 * j0;
    const float* pr[R];
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) pr[r] = p[r] + (lo - c0);
    const int64_t n = hi - lo;
    int64_t i = 0;
    if (lo & 1) {
      pv_key_parts<P, R, E>(pr, 0, vr, odds);
      i = 1;
    }
    // The V row advances by a pointer (GCC turned vr + i * stride into an imul and a lea per
    // pair of keys).
    const E* v = vr + i * stride;
    for (; i + 1 < n; i += 2, v += 2 * stride) {
      pv_key_parts<P, R, E>(pr, i, v, even);
      pv_key_parts<P, R, E>(pr, i + 1, v + stride, odds);
    }
    if (i < n) pv_key_parts<P, R, E>(pr, i, v, even);
  }
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < P; ++j) {
      _mm256_storeu_ps(acc[r] + 8 * (j0 + j), even[r][j]);
      _mm256_storeu_ps(acc[r] + odd + 8 * (j0 + j), odds[r][j]);
    }
}

template <typename E>
using PvPartsFn = void (*)(const float* const*, int64_t, const KvRun<E>*, int64_t, int64_t, int64_t, int64_t, int64_t,
                           float* const*, int64_t);

template <typename E>
PvPartsFn<E> pv_parts_fn(int64_t parts, int64_t rows) {
  if (rows >= 3) return parts == 1 ? &pv_runs_parts<1, 3, E> : &pv_runs_parts<2, 3, E>;
  if (rows >= 2) return parts == 1 ? &pv_runs_parts<1, 2, E> : parts == 2 ? &pv_runs_parts<2, 2, E> : &pv_runs_parts<3, 2, E>;
  return parts == 1 ? &pv_runs_parts<1, 1, E> : parts == 2 ? &pv_runs_parts<2, 1, E> : &pv_runs_parts<3, 1, E>;
}
#endif

// out[0, v_dim) = (even + odd sets of acc) * inv.
inline void pv_finish(const float* acc, int64_t v_dim, float inv, float* out) {
  const int64_t nv = (v_dim + 15) / 16;
  const Vec16 iv(inv);
  for (int64_t j = 0; j < nv; ++j)
    vstore_n(out + 16 * j, (vload(acc + 16 * j) + vload(acc + 16 * (nv + j))) * iv, v_dim - 16 * j);
}

// s[i] = exp(s[i] - m) in place for i < n; returns their sum (16 lane partial sums, the tree).
inline float exp_store_sum(float* s, float m, int64_t n) {
  const Vec16 mv(m);
  Vec16 acc = vzero();
  for (int64_t i = 0; i < n; i += kLanes) {
    const Vec16 e = exp_approx(vload_n(s + i, n - i) - mv);
    acc = acc + vkeep(e, n - i);
    vstore_n(s + i, e, n - i);
  }
  return vsum(acc);
}

// The runs of key positions [c0, c1) (at most kChunk) for kv_head into runs[], in increasing
// order: one per page in paged mode (head-major pages: a 16-slot page of a 64-dim head is one
// contiguous block), else the batch's own rows (kv_heads rows apart). Returns their count; the
// rows' strides go to *k_stride and *v_stride. One division per chunk, not one per page.
template <typename E>
inline int64_t kv_runs(const KvSource& kv, const AttentionSeq& s, int64_t kv_head, const AttentionDims& d, int64_t c0,
                       int64_t c1, KvRun<E>* runs, int64_t* k_stride, int64_t* v_stride) {
  const E* kb = static_cast<const E*>(kv.k);
  const E* vb = static_cast<const E*>(kv.v);
  if (kv.page_size == 0) {
    *k_stride = d.num_kv_heads * d.qk_dim, *v_stride = d.num_kv_heads * d.v_dim;
    runs[0] = KvRun<E>{c0, c1 - c0, 0, kb + (s.token_begin + c0) * *k_stride + kv_head * d.qk_dim,
                       vb + (s.token_begin + c0) * *v_stride + kv_head * d.v_dim};
    return 1;
  }
  *k_stride = d.qk_dim, *v_stride = d.v_dim;
  const int64_t ps = kv.page_size;
  const int64_t k_page = d.num_kv_heads * ps * d.qk_dim, v_page = d.num_kv_heads * ps * d.v_dim;
  int64_t count = 0;
  for (int64_t t = c0, index = c0 / ps, slot = c0 - index * ps; t < c1; ++index, slot = 0) {
    const int64_t page = s.page_table[index], n = std::min(ps - slot, c1 - t);
    runs[count++] = KvRun<E>{t, n, index, kb + page * k_page + (kv_head * ps + slot) * d.qk_dim,
                             vb + page * v_page + (kv_head * ps + slot) * d.v_dim};
    t += n;
  }
  return count;
}

// Requests [p, p + bytes) into L2.
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) prefetch_l2(c + b);
}

// Requests the K rows of slots [lo, hi) of page-table entry `index` into L2 (paged mode).
// The hardware prefetchers stop at each page's end (pages are scattered), so the score loop
// requests the K rows two pages ahead and the V rows of the page it is on (read after the
// chunk's softmax), in two halves, one before each half of the page's scores. Measured on
// batch-32 decode attention over shuffled pages (a microbenchmark), f32 / bf16 K/V:
//   K and V one page ahead, one burst:   23.4 / 10.1-12.7 ms (bf16: depending only on where
//                                        the linker placed the code)
//   K two ahead, V after the scores:     21.0 / 9.1-9.5 ms
//   the same in halves (this):           16.5-17.3 / 8.8-9.2 ms in every build tried
// prefetcht0, whole chunks at once (a chunk ahead), or K three pages ahead did worse; with the
// cache out of L3 (384 sequences), K 2-8 pages ahead and V 0-4 ahead all read 25-30 GB/s.
template <typename E>
inline void prefetch_k_page(const KvSource& kv, const AttentionSeq& s, int64_t kv_head, const AttentionDims& d,
                            int64_t index, int64_t lo, int64_t hi) {
  if (lo >= hi) return;
  const int64_t ps = kv.page_size, page = s.page_table[index];
  const E* k = static_cast<const E*>(kv.k) + (page * d.num_kv_heads + kv_head) * ps * d.qk_dim;
  prefetch_bytes(k + lo * d.qk_dim, (hi - lo) * d.qk_dim * static_cast<int64_t>(sizeof(E)));
}

#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
// Prefill on v3 and v4: a sequence with at least this many new tokens (4 work items per kv head)
// has its K rows transposed once per call for qk_scores_transposed, when the q/k dim is a
// multiple of 16; the transposed copies of one call take at most kMaxTransposedFloats (64 MiB;
// sequences past it keep the lane-major tiles, which give the same bits).
constexpr int64_t kTransposeMinTokens = 16;
static_assert(kChunk % kQkTransposedKeys == 0, "a transposed chunk is whole score tiles");
constexpr int64_t kMaxTransposedFloats = int64_t{16} << 20;

// 8 elements of a K row as f32 bits.
inline __m256i widen8(const float* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i widen8(const uint16_t* p) {
  return _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
}

// The K rows of positions [c0, c1) (one chunk) of kv head h into kt[d * kChunk + c - c0],
// widened to f32; columns past c1 - c0 are zero.
template <typename E>
void transpose_k_chunk(const KvSource& kv, const AttentionSeq& s, int64_t h, const AttentionDims& d, int64_t c0,
                       int64_t c1, float* kt) {
  KvRun<E> runs[kChunk];
  int64_t ks = 0, vs = 0;
  const int64_t nruns = kv_runs<E>(kv, s, h, d, c0, c1, runs, &ks, &vs);
  const E* rows[kChunk];
  int64_t n = 0;
  for (int64_t k = 0; k < nruns; ++k)
    for (int64_t i = 0; i < runs[k].n; ++i) rows[n++] = runs[k].k + i * ks;
  for (int64_t c = 0; c < kChunk; c += 8)
    for (int64_t d0 = 0; d0 < d.qk_dim; d0 += 8) {
      __m256i x[8], t[8];
      for (int64_t j = 0; j < 8; ++j) x[j] = c + j < n ? widen8(rows[c + j] + d0) : _mm256_setzero_si256();
      transpose8x8_epi32(x, t);
      for (int64_t j = 0; j < 8; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(kt + (d0 + j) * kChunk + c), t[j]);
    }
}

// Plans the call's transpositions: scratch.kt_at, kt_jobs and kt's size.
inline void plan_transposed_k(const AttentionSeq* seqs, int64_t num_seqs, const AttentionDims& d,
                              AttentionScratch& scratch) {
  scratch.kt_at.assign(static_cast<size_t>(num_seqs), -1);
  scratch.kt_jobs.clear();
  if (d.qk_dim % kLanes != 0) return;
  int64_t total = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (seqs[s].num_tokens < kTransposeMinTokens) continue;
    const int64_t chunks = (seqs[s].context_len + seqs[s].num_tokens + kChunk - 1) / kChunk;
    const int64_t floats = d.num_kv_heads * chunks * d.qk_dim * kChunk;
    if (total + floats > kMaxTransposedFloats) continue;
    scratch.kt_at[static_cast<size_t>(s)] = total;
    total += floats;
    for (int64_t h = 0; h < d.num_kv_heads; ++h)
      for (int64_t c = 0; c < chunks; ++c)
        scratch.kt_jobs.push_back({static_cast<int32_t>(s), static_cast<int32_t>(h), static_cast<int32_t>(c)});
  }
  if (static_cast<int64_t>(scratch.kt.size()) < total) scratch.kt.resize(static_cast<size_t>(total));
}

// Where kv head h's transposed K of sequence s starts (nullptr: not transposed).
inline float* transposed_k(AttentionScratch& scratch, const AttentionSeq& sq, int64_t s, int64_t h,
                           const AttentionDims& d) {
  const int64_t at = scratch.kt_at[static_cast<size_t>(s)];
  if (at < 0) return nullptr;
  const int64_t chunks = (sq.context_len + sq.num_tokens + kChunk - 1) / kChunk;
  return scratch.kt.data() + at + h * chunks * d.qk_dim * kChunk;
}
#endif

// Per-thread buffers of one work item.
struct ItemScratch {
  float* scores;        // [rows][kChunk]
  float* acc;           // [rows][acc_stride]
  float* max;           // [rows] running max of the scores
  float* sum;           // [rows] running sum of exp(score - max)
  const float** qrows;  // [rows] the query rows
  int64_t acc_stride;
};

// One row's softmax state after the scores of a chunk s[0, n): p = exp(s - m) in place with
// m the running max, the row's V accumulators and sum rescaled by exp(m_old - m) when the max
// grew. Every step is a fixed function of the row's own scores, so a row's result depends
// only on its positions and the fixed chunk boundaries.
inline void online_softmax(float* s, int64_t n, float& max, float& sum, float* acc, int64_t acc_len) {
  const float m = std::max(max, max_value(s, n));
  if (m > max && sum > 0.0f) {
    const float alpha = exp_approx(max - m);
    for (int64_t i = 0; i < acc_len; ++i) acc[i] *= alpha;
    sum *= alpha;
  }
  max = m;
  sum += exp_store_sum(s, m, n);
}

// The V pass's split of positions [lo, hi) among a work item's rows (row r sees positions
// [0, len0 + r / groups)): for each group of up to `group` rows from r0, fn(nr, r0, b, e) over
// the positions [b, e) all of them see, then fn(1, r, b, e) for each row's own remaining ones
// (the later tokens of a causal prefill block).
template <typename Fn>
inline void for_each_row_span(int64_t rows, int64_t group, int64_t groups, int64_t len0, int64_t lo, int64_t hi,
                              Fn&& fn) {
  for (int64_t r0 = 0; r0 < rows; r0 += group) {
    const int64_t nr = std::min(group, rows - r0);
    const int64_t common = std::clamp(len0 + r0 / groups, lo, hi);  // the shortest row's end
    if (common > lo) fn(nr, r0, lo, common);
    for (int64_t r = r0; r < r0 + nr; ++r) {
      const int64_t end = std::min(hi, len0 + r / groups);
      if (end > common) fn(int64_t{1}, r, common, end);
    }
  }
}

// One work item: tokens [t0, t0 + nt) of sequence s against kv head kvh, all query heads of
// the group. Key positions go in chunks of kChunk fixed by position (never by page or batch):
// scores, the online softmax and the weighted V rows of one chunk, so K, V and the scores of
// a chunk are still in L1/L2 when reused. E: the K/V element (float, or uint16_t for bf16).
// kt: the sequence's K of kv head kvh transposed ([chunk][qk_dim][kChunk], v3 and v4 prefill), or nullptr.
template <typename E>
void attend_block(const float* q, const KvSource& kv, const AttentionSeq& s, int64_t t0, int64_t nt, int64_t kvh,
                  const AttentionDims& d, const float* kt, float* out, float* lse, const ItemScratch& w) {
  const int64_t groups = d.num_heads / d.num_kv_heads;
  const int64_t rows = nt * groups;
  // Causal: token t0 + j sees positions [0, len0 + j).
  const int64_t len0 = s.context_len + (t0 - s.token_begin) + 1;
  const int64_t len_max = len0 + nt - 1;
  for (int64_t r = 0; r < rows; ++r)
    w.qrows[r] = q + ((t0 + r / groups) * d.num_heads + kvh * groups + r % groups) * d.qk_dim;
  const QueryRows qr{w.qrows, rows, d.qk_dim};
  const int64_t nv = (d.v_dim + 15) / 16;
  // The V-pass kernels for 1..row_group rows of a chunk of dims, chosen once per work item.
  const int64_t chunk_nv = std::min(nv, kPvMaxNv);
#if defined(ASTRAI_ISA_V3)
  // Measured (bench/attention_bench, Zen 3): parts pay for prefill blocks, and for 3-row
  // decode items (GQA 3) over bf16 K/V, which widen each V part once for the 3 rows; over f32
  // K/V those did 7% better one row at a time over 3 + 1 Vec16s.
  const bool by_parts = d.v_dim % 8 == 0 && (rows >= 4 || (rows == 3 && std::is_same_v<E, uint16_t>));
  const int64_t row_group = by_parts ? kPartRows : pv_rows(chunk_nv);
#else
  const int64_t row_group = pv_rows(chunk_nv);
#endif
  PvRunsFn<E> pass[4][2] = {};  // [rows][0: a full chunk of dims, 1: the last chunk]
  const int64_t last_nv = nv - (nv - 1) / kPvMaxNv * kPvMaxNv;  // Vec16s in the last chunk
  for (int64_t r = 1; r <= row_group; ++r) {
    pass[r][0] = pv_runs_fn<E>(chunk_nv, r);
    pass[r][1] = pv_runs_fn<E>(last_nv, r);
  }
  const int64_t last_n = d.v_dim - 16 * (nv - 1);  // dims in the last Vec16
  // The V pass of chunk [c0, c1) over its runs: rows in groups sharing each V load over the
  // positions all of them see (for_each_row_span), each group by chunks of dims.
  const auto v_pass = [&](int64_t c0, int64_t c1, const KvRun<E>* runs, int64_t nruns, int64_t vs) {
    for_each_row_span(rows, row_group, groups, len0, c0, c1, [&](int64_t nr, int64_t r0, int64_t b, int64_t e) {
      const float* p[3];
      float* a[3];
      for (int64_t i = 0; i < nr; ++i) {
        p[i] = w.scores + (r0 + i) * kChunk;
        a[i] = w.acc + (r0 + i) * w.acc_stride;
      }
#if defined(ASTRAI_ISA_V3)
      if (by_parts) {
        const int64_t parts = d.v_dim / 8;
        for (int64_t j0 = 0, step = parts_per_pass(nr); j0 < parts; j0 += step)
          pv_parts_fn<E>(std::min(step, parts - j0), nr)(p, c0, runs, nruns, b, e, vs, j0, a, 16 * nv);
        return;
      }
#endif
      for (int64_t j0 = 0; j0 < nv; j0 += kPvMaxNv) {
        const bool last = j0 + kPvMaxNv >= nv;
        pass[nr][last ? 1 : 0](p, c0, runs, nruns, b, e, vs, j0, last ? last_n : 16, a, 16 * nv);
      }
    });
  };
  std::fill(w.acc, w.acc + rows * w.acc_stride, 0.0f);
  std::fill(w.max, w.max + rows, -INFINITY);
  std::fill(w.sum, w.sum + rows, 0.0f);
  const int64_t ps = kv.page_size;
  const bool paged = ps > 0;
  // The K rows of page-table entry `index`, slots [lo, hi) clipped to the positions the item reads.
  const auto prefetch_k = [&](int64_t index, int64_t lo, int64_t hi) {
    const int64_t end = std::min(hi, len_max - index * ps);
    if (paged && end > 0) prefetch_k_page<E>(kv, s, kvh, d, index, lo, end);
  };
  const int64_t vbytes = d.v_dim * static_cast<int64_t>(sizeof(E));
  // The scores of chunk [c0, ...) from its K rows as stored, run by run: in two halves, each
  // after requesting its half of the K rows two pages ahead and of this page's V rows.
  const auto scores_by_runs = [&](int64_t c0, const KvRun<E>* runs, int64_t nruns, int64_t ks, int64_t vs) {
    for (int64_t k = 0; k < nruns; ++k) {
      const KvRun<E>& run = runs[k];
      const int64_t h = run.n / 2;
      prefetch_k(run.page + 2, 0, ps / 2);
      if (paged) prefetch_bytes(run.v, h * vbytes);
      qk_scores(qr, run.k, ks, run.p0 - c0, h, d.scale, w.scores, kChunk);
      prefetch_k(run.page + 2, ps / 2, ps);
      if (paged) prefetch_bytes(run.v + h * vs, (run.n - h) * vbytes);
      qk_scores(qr, run.k + h * ks, ks, run.p0 + h - c0, run.n - h, d.scale, w.scores, kChunk);
    }
  };
#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
  // The scores of chunk [c0, c1) from its transposed K, the chunk's V rows requested first.
  const auto scores_transposed = [&](int64_t c0, int64_t c1, const KvRun<E>* runs, int64_t nruns) {
    for (int64_t k = 0; k < nruns && paged; ++k) prefetch_bytes(runs[k].v, runs[k].n * vbytes);
    qk_scores_transposed(qr, kt + c0 / kChunk * d.qk_dim * kChunk, kChunk, c1 - c0, d.scale, w.scores, kChunk);
  };
#endif
  if (!kt) {
    prefetch_k(0, 0, ps);
    prefetch_k(1, 0, ps);
  }
  KvRun<E> runs[kChunk];
  for (int64_t c0 = 0; c0 < len_max; c0 += kChunk) {
    const int64_t c1 = std::min(c0 + kChunk, len_max);
    int64_t ks = 0, vs = 0;
    const int64_t nruns = kv_runs<E>(kv, s, kvh, d, c0, c1, runs, &ks, &vs);
#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
    if (kt) scores_transposed(c0, c1, runs, nruns);
    else
#endif
      scores_by_runs(c0, runs, nruns, ks, vs);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = std::min(c1, len0 + r / groups) - c0;  // a prefill block's first rows may end before c0
      if (n > 0) online_softmax(w.scores + r * kChunk, n, w.max[r], w.sum[r], w.acc + r * w.acc_stride, w.acc_stride);
    }
    v_pass(c0, c1, runs, nruns, vs);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = (t0 + r / groups) * d.num_heads + kvh * groups + r % groups;
    if (lse) lse[row] = w.max[r] + std::log(w.sum[r]);
    pv_finish(w.acc + r * w.acc_stride, d.v_dim, 1.0f / w.sum[r], out + row * d.v_dim);
  }
}

}  // namespace

void attention(const float* q, const KvSource& kv, const AttentionSeq* seqs, int64_t num_seqs,
               const AttentionDims& d, float* out, AttentionScratch& scratch, float* lse) {
  const int64_t groups = d.num_heads / d.num_kv_heads;
  // Work items: blocks of up to kTokenBlock consecutive tokens of one sequence, per kv head.
  scratch.blocks.clear();
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t j = 0; j < seqs[s].num_tokens; j += kTokenBlock)
      scratch.blocks.push_back({static_cast<int32_t>(s), seqs[s].token_begin + static_cast<int32_t>(j),
                                static_cast<int32_t>(std::min<int64_t>(kTokenBlock, seqs[s].num_tokens - j))});
  }
  const int64_t rows = kTokenBlock * groups;
  const int64_t acc_stride = 2 * ((d.v_dim + 15) / 16) * 16;  // even + odd sets
  const int64_t per_thread = rows * (kChunk + acc_stride + 2);
  const int threads = omp_get_max_threads();
  if (static_cast<int64_t>(scratch.buf.size()) < per_thread * threads)
    scratch.buf.resize(static_cast<size_t>(per_thread * threads));
  if (static_cast<int64_t>(scratch.qrows.size()) < rows * threads) scratch.qrows.resize(static_cast<size_t>(rows * threads));
  const int64_t items = static_cast<int64_t>(scratch.blocks.size()) * d.num_kv_heads;

  const int64_t chunk = std::max<int64_t>(1, d.num_kv_heads / threads);
#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
  plan_transposed_k(seqs, num_seqs, d, scratch);
  const int64_t kt_jobs = static_cast<int64_t>(scratch.kt_jobs.size());
#endif
#pragma omp parallel
  {
#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
#pragma omp for schedule(static)
    for (int64_t j = 0; j < kt_jobs; ++j) {
      const AttentionScratch::KtJob& job = scratch.kt_jobs[static_cast<size_t>(j)];
      const AttentionSeq& sq = seqs[job.seq];
      float* kt = transposed_k(scratch, sq, job.seq, job.head, d) + job.chunk * d.qk_dim * kChunk;
      const int64_t c0 = int64_t{job.chunk} * kChunk;
      const int64_t c1 = std::min(c0 + kChunk, int64_t{sq.context_len} + sq.num_tokens);
      if (kv.bf16) transpose_k_chunk<uint16_t>(kv, sq, job.head, d, c0, c1, kt);
      else transpose_k_chunk<float>(kv, sq, job.head, d, c0, c1, kt);
    }
#endif
    float* base = scratch.buf.data() + per_thread * omp_get_thread_num();
    const ItemScratch w{base,
                        base + rows * kChunk,
                        base + rows * (kChunk + acc_stride),
                        base + rows * (kChunk + acc_stride + 1),
                        scratch.qrows.data() + rows * omp_get_thread_num(),
                        acc_stride};
    // Round-robin items: causal rows grow in cost along the sequence, so contiguous blocks
    // would leave one thread with most of the work. In runs of kv_heads / threads items, so
    // that the threads share each block's heads: they stream the adjacent K/V runs of the same
    // pages at the same time (decode of 128 sequences over bf16 K/V from memory, 4 heads on 2
    // threads: every one of 8 alternating pairs faster, medians 26.4 -> 30.4 GB/s; all of a
    // block's heads on one thread measured no better than one each). Results do not depend on
    // the schedule.
#pragma omp for schedule(static, chunk)
    for (int64_t item = 0; item < items; ++item) {
      const AttentionScratch::Block& b = scratch.blocks[static_cast<size_t>(item / d.num_kv_heads)];
      const int64_t h = item % d.num_kv_heads;
#if defined(ASTRAI_ISA_V3) || defined(ASTRAI_ISA_V4)
      const float* kt = transposed_k(scratch, seqs[b.seq], b.seq, h, d);
#else
      const float* kt = nullptr;
#endif
      if (kv.bf16) attend_block<uint16_t>(q, kv, seqs[b.seq], b.token, b.count, h, d, kt, out, lse, w);
      else attend_block<float>(q, kv, seqs[b.seq], b.token, b.count, h, d, kt, out, lse, w);
    }
  }
}

// The inference kernel over the batch's own K/V, one sequence per document, plus the
// log-sum-exp of every row (training saves it for the backward).
void attention_forward_train(const float* q, const float* k, const float* v, const std::vector<AttnSpan>& spans,
                             const AttnShape& s, float* out, float* lse) {
  thread_local std::vector<AttentionSeq> seqs;
  thread_local AttentionScratch scratch;
  seqs.clear();
  for (const AttnSpan& sp : spans) seqs.push_back(AttentionSeq{sp.begin, sp.len, 0, nullptr});
  const AttentionDims d{s.heads, s.kv_heads, s.qk_dim, s.v_dim, s.scale};
  ASTRAI_ISA::attention(q, KvSource{k, v, 0}, seqs.data(), static_cast<int64_t>(seqs.size()), d, out, scratch, lse);
}

void fill_attention(KernelTable& t) {
  t.attention = &attention;
  t.attention_forward_train = &attention_forward_train;
}

ASTRAI_KERNELS_END
