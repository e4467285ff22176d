#include "kernels/cpu/attention.h"

// GCC 12's AVX-512 headers (_mm512_undefined_ps) trip the uninitialized warnings.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_simd.h"  // with exp512.h and immintrin.h on AVX-512 builds
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/vexp.h"

namespace astrai::kernels {

namespace {

// Up to this many consecutive new tokens of one sequence share each K/V row read (prefill):
// the rows come from L2 once per block instead of once per token.
constexpr int64_t kTokenBlock = 4;
// Key positions per chunk of the online softmax, by absolute position: a chunk's scores
// stay in L1 between the score, softmax and V steps.
constexpr int64_t kChunk = 64;


// The hot loops, one version per build. Each output is a fixed sequence of operations that
// depends only on its own query row and key positions, never on the batch, the blocking, the
// page size or pointer alignment.
#if defined(__AVX512F__)
// s[i] = exp(s[i] - m) in place for i < n; returns their sum (16 lane partial sums, one
// fixed tree).
inline float exp_store_sum(float* s, float m, int64_t n) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), mv));
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    _mm512_mask_storeu_ps(s + i, k, e);
  }
  return _mm512_reduce_add_ps(acc);
}

inline float exp_one(float x) { return _mm512_cvtss_f32(exp512(_mm512_set1_ps(x))); }

// Weighted sum of V rows for R query rows at once: key position j (absolute, p0 + i) goes
// to the even or odd set of a row's accumulators by its parity, so consecutive keys form
// independent FMA chains; the sets are kept in acc[r] ([2][NV][16] floats) between spans and
// added at the end. Each V vector is loaded once for the R rows. Storing and reloading f32 is
// exact and a row's operations do not depend on the rows beside it, so the result depends
// only on the positions, never on how they were split into spans or grouped into rows.
template <int NV, int R, typename E>
inline void pv_key(const float* const* p, int64_t i, const E* row, __mmask16 last, __m512 (*acc)[NV]) {
  __m512 pv[R];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r) pv[r] = _mm512_set1_ps(p[r][i]);
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    const __m512 v = load_row16(row + 16 * j, j < NV - 1 ? __mmask16{0xffff} : last);
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(pv[r], v, acc[r][j]);
  }
}

template <int NV, int R, typename E>
void pv_span(const float* const* p, int64_t p0, int64_t n, const E* vr, int64_t stride, __mmask16 last,
             float* const* acc) {
  __m512 even[R][NV], odd[R][NV];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      even[r][j] = _mm512_loadu_ps(acc[r] + 16 * j);
      odd[r][j] = _mm512_loadu_ps(acc[r] + 16 * (NV + j));
    }
  int64_t i = 0;
  if (n > 0 && (p0 & 1)) {
    pv_key<NV, R, E>(p, 0, vr, last, odd);
    i = 1;
  }
  for (; i + 1 < n; i += 2) {
    pv_key<NV, R, E>(p, i, vr + i * stride, last, even);
    pv_key<NV, R, E>(p, i + 1, vr + (i + 1) * stride, last, odd);
  }
  if (i < n) pv_key<NV, R, E>(p, i, vr + i * stride, last, even);
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      _mm512_storeu_ps(acc[r] + 16 * j, even[r][j]);
      _mm512_storeu_ps(acc[r] + 16 * (NV + j), odd[r][j]);
    }
}

template <typename E>
using PvSpanFn = void (*)(const float* const*, int64_t, int64_t, const E*, int64_t, __mmask16, float* const*);

// The V-pass kernel for v_dim in (16 * (NV - 1), 16 * NV] and up to R rows, or null (wider
// than 128: att_axpy path). R is capped so the 2 * NV * R accumulators stay in registers.
template <int NV>
constexpr int kPvRows = 2 * NV * 3 + 4 <= 32 ? 3 : 2 * NV * 2 + 4 <= 32 ? 2 : 1;

template <int NV, typename E>
PvSpanFn<E> pv_span_for(int64_t rows) {
  if (rows >= 3 && kPvRows<NV> >= 3) return &pv_span<NV, (kPvRows<NV> >= 3 ? 3 : 1), E>;
  if (rows >= 2 && kPvRows<NV> >= 2) return &pv_span<NV, (kPvRows<NV> >= 2 ? 2 : 1), E>;
  return &pv_span<NV, 1, E>;
}

int64_t pv_rows(int64_t nv) {
  switch (nv) {
    case 1: return kPvRows<1>;
    case 2: return kPvRows<2>;
    case 3: return kPvRows<3>;
    case 4: return kPvRows<4>;
    case 5: return kPvRows<5>;
    case 6: return kPvRows<6>;
    case 7: return kPvRows<7>;
    default: return kPvRows<8>;
  }
}

template <typename E>
PvSpanFn<E> pv_span_fn(int64_t nv, int64_t rows) {
  switch (nv) {
    case 1: return pv_span_for<1, E>(rows);
    case 2: return pv_span_for<2, E>(rows);
    case 3: return pv_span_for<3, E>(rows);
    case 4: return pv_span_for<4, E>(rows);
    case 5: return pv_span_for<5, E>(rows);
    case 6: return pv_span_for<6, E>(rows);
    case 7: return pv_span_for<7, E>(rows);
    case 8: return pv_span_for<8, E>(rows);
    default: return nullptr;
  }
}

template <typename E>
inline void att_axpy(float p, const E* x, int64_t n, float* y) {
  const __m512 pv = _mm512_set1_ps(p);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(pv, load_row16(x + i, m), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// out[0, v_dim) = (even + odd halves of acc, pv_span's layout) * inv.
inline void pv_finish(const float* acc, int64_t v_dim, float inv, float* out) {
  const int64_t nv = (v_dim + 15) / 16;
  const __m512 iv = _mm512_set1_ps(inv);
  for (int64_t j = 0; j < nv; ++j)
    _mm512_mask_storeu_ps(
        out + 16 * j, tail_mask(v_dim - 16 * j),
        _mm512_mul_ps(_mm512_add_ps(_mm512_loadu_ps(acc + 16 * j), _mm512_loadu_ps(acc + 16 * (nv + j))), iv));
}
#else
struct PvUnused {};
template <typename E>
using PvSpanFn = PvUnused*;
template <typename E>
inline PvSpanFn<E> pv_span_fn(int64_t, int64_t) { return nullptr; }
inline int64_t pv_rows(int64_t) { return 1; }
template <typename E>
inline void att_axpy(float p, const E* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += p * widen(x[i]);
}
inline float exp_store_sum(float* s, float m, int64_t n) {
  exp_shifted(s, m, n, s);
  return sum(s, n);
}
inline float exp_one(float x) { return exp_approx(x); }
#endif

// Requests [p, p + bytes) into L2. An asm statement, not __builtin_prefetch: GCC treats the
// builtin as free of side effects, so a helper that only prefetches (prefetch_rows) is found
// pure and its calls are deleted.
inline void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) {
#if defined(__x86_64__)
    asm volatile("prefetcht1 %0" : : "m"(c[b]));
#else
    __builtin_prefetch(c + b, 0, 2);
#endif
  }
}

// Calls fn(first_position, count, k_rows, v_rows, k_stride, v_stride) for consecutive runs
// of key positions [c0, c1) whose rows for kv_head are evenly spaced, in increasing order:
// one run per page in paged mode (head-major pages: a 16-slot page of a 64-dim head is one
// contiguous block), else the batch's own rows (kv_heads rows apart).
template <typename E, typename Fn>
inline void for_each_kv_run(const KvSource& kv, const AttentionSeq& s, int64_t kv_head, const AttentionDims& d,
                            int64_t c0, int64_t c1, Fn&& fn) {
  const E* kb = static_cast<const E*>(kv.k);
  const E* vb = static_cast<const E*>(kv.v);
  if (kv.page_size == 0) {
    const int64_t k_stride = d.num_kv_heads * d.qk_dim, v_stride = d.num_kv_heads * d.v_dim;
    fn(c0, c1 - c0, kb + (s.token_begin + c0) * k_stride + kv_head * d.qk_dim,
       vb + (s.token_begin + c0) * v_stride + kv_head * d.v_dim, k_stride, v_stride);
    return;
  }
  const int64_t ps = kv.page_size;
  const int64_t k_page = d.num_kv_heads * ps * d.qk_dim, v_page = d.num_kv_heads * ps * d.v_dim;
  for (int64_t t = c0; t < c1;) {
    const int64_t page = s.page_table[t / ps], slot = t % ps, n = std::min(ps - slot, c1 - t);
    fn(t, n, kb + page * k_page + (kv_head * ps + slot) * d.qk_dim, vb + page * v_page + (kv_head * ps + slot) * d.v_dim,
       d.qk_dim, d.v_dim);
    t += n;
  }
}

// Requests the K rows (k) and/or V rows (v) of positions [c0, c1) into L2. The hardware
// prefetchers stop at each page's end (pages are scattered), so the score loop requests the K
// rows two pages ahead and the V rows of the page it is on (read after the chunk's softmax),
// in two halves, one before each half of the page's scores. Measured on batch-32 decode
// attention over shuffled pages (a microbenchmark), f32 / bf16 K/V:
//   K and V one page ahead, one burst:   23.4 / 10.1-12.7 ms (bf16: depending only on where
//                                        the linker placed the code)
//   K two ahead, V after the scores:     21.0 / 9.1-9.5 ms
//   the same in halves (this):           16.5-17.3 / 8.8-9.2 ms in every build tried
// prefetcht0, whole chunks at once (a chunk ahead), or K three pages ahead did worse.
template <typename E>
inline void prefetch_rows(const KvSource& kv, const AttentionSeq& s, int64_t kv_head, const AttentionDims& d,
                          int64_t c0, int64_t c1, bool k, bool v) {
  if (kv.page_size == 0 || c0 >= c1) return;  // the batch's own rows: sequential, prefetched by hardware
  for_each_kv_run<E>(kv, s, kv_head, d, c0, c1, [&](int64_t, int64_t n, const E* kr, const E* vr, int64_t, int64_t) {
    if (k) prefetch_l2(kr, n * d.qk_dim * static_cast<int64_t>(sizeof(E)));
    if (v) prefetch_l2(vr, n * d.v_dim * static_cast<int64_t>(sizeof(E)));
  });
}

// Per-thread buffers of one work item.
struct ItemScratch {
  float* scores;  // [rows][kChunk]
  float* acc;     // [rows][acc_stride]
  float* max;     // [rows] running max of the scores
  float* sum;     // [rows] running sum of exp(score - max)
  int64_t acc_stride;
};

// One row's softmax state after the scores of a chunk s[0, n): p = exp(s - m) in place with
// m the running max, the row's V accumulators and sum rescaled by exp(m_old - m) when the max
// grew. Every step is a fixed function of the row's own scores, so a row's result depends
// only on its positions and the fixed chunk boundaries.
inline void online_softmax(float* s, int64_t n, float& max, float& sum, float* acc, int64_t acc_len) {
  const float m = std::max(max, vmax(s, n));
  if (m > max && sum > 0.0f) {
    const float alpha = exp_one(max - m);
    for (int64_t i = 0; i < acc_len; ++i) acc[i] *= alpha;
    sum *= alpha;
  }
  max = m;
  sum += exp_store_sum(s, m, n);
}

// One work item: tokens [t0, t0 + nt) of sequence s against kv head kvh, all query heads of
// the group. Key positions go in chunks of kChunk fixed by position (never by page or batch):
// scores, the online softmax and the weighted V rows of one chunk, so K, V and the scores of
// a chunk are still in L1/L2 when reused. E: the K/V element (float, or uint16_t for bf16).
template <typename E>
void attend_block(const float* q, const KvSource& kv, const AttentionSeq& s, int64_t t0, int64_t nt, int64_t kvh,
                  const AttentionDims& d, float* out, float* lse, const ItemScratch& w) {
  const int64_t groups = d.num_heads / d.num_kv_heads;
  const int64_t rows = nt * groups;
  // Causal: token t0 + j sees positions [0, len0 + j).
  const int64_t len0 = s.context_len + (t0 - s.token_begin) + 1;
  const int64_t len_max = len0 + nt - 1;
  const QueryBlock qb{q + (t0 * d.num_heads + kvh * groups) * d.qk_dim, nt, groups, d.num_heads * d.qk_dim, d.qk_dim};
  const int64_t nv = (d.v_dim + 15) / 16;
  // The V-pass kernels for 1..row_group rows, chosen once per work item (null: v_dim over 128
  // or no AVX-512, the att_axpy path, one row at a time).
  const int64_t row_group = pv_span_fn<E>(nv, 1) != nullptr ? pv_rows(nv) : 1;
  PvSpanFn<E> span[4] = {};
  for (int64_t r = 1; r <= row_group; ++r) span[r] = pv_span_fn<E>(nv, r);
  const bool simd = span[1] != nullptr;
#if defined(__AVX512F__)
  const __mmask16 last = tail_mask(d.v_dim - 16 * (nv - 1));
#endif
  std::fill(w.acc, w.acc + rows * w.acc_stride, 0.0f);
  std::fill(w.max, w.max + rows, -INFINITY);
  std::fill(w.sum, w.sum + rows, 0.0f);
  prefetch_rows<E>(kv, s, kvh, d, 0, std::min<int64_t>(2 * kv.page_size, len_max), true, false);  // K of pages 0, 1
  for (int64_t c0 = 0; c0 < len_max; c0 += kChunk) {
    const int64_t c1 = std::min(c0 + kChunk, len_max);
    for_each_kv_run<E>(kv, s, kvh, d, c0, c1, [&](int64_t p0, int64_t n, const E* kr, const E*, int64_t ks, int64_t) {
      // In two halves, each after requesting its half of the K rows two pages ahead and of
      // this page's V rows.
      const int64_t h = n / 2;
      prefetch_rows<E>(kv, s, kvh, d, p0 + 2 * n, std::min(p0 + 2 * n + h, len_max), true, false);
      prefetch_rows<E>(kv, s, kvh, d, p0, p0 + h, false, true);
      qk_scores(qb, kr, ks, p0 - c0, h, d.scale, w.scores, kChunk);
      prefetch_rows<E>(kv, s, kvh, d, std::min(p0 + 2 * n + h, len_max), std::min(p0 + 3 * n, len_max), true, false);
      prefetch_rows<E>(kv, s, kvh, d, p0 + h, p0 + n, false, true);
      qk_scores(qb, kr + h * ks, ks, p0 + h - c0, n - h, d.scale, w.scores, kChunk);
    });
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = std::min(c1, len0 + r / groups) - c0;  // a prefill block's first rows may end before c0
      if (n > 0) online_softmax(w.scores + r * kChunk, n, w.max[r], w.sum[r], w.acc + r * w.acc_stride, w.acc_stride);
    }
    for_each_kv_run<E>(kv, s, kvh, d, c0, c1, [&](int64_t p0, int64_t n, const E*, const E* vr, int64_t, int64_t vs) {
      // Rows in groups sharing each V load over the positions all of them see; a row's own
      // remaining positions (causal prefill blocks) go alone.
      for (int64_t r0 = 0; r0 < rows; r0 += row_group) {
        const int64_t nr = std::min(row_group, rows - r0);
        const int64_t common = simd ? std::clamp<int64_t>(len0 + r0 / groups - p0, 0, n) : 0;  // shortest row
        const float* p[3];
        float* a[3];
        for (int64_t i = 0; i < nr; ++i) {
          p[i] = w.scores + (r0 + i) * kChunk + (p0 - c0);
          a[i] = w.acc + (r0 + i) * w.acc_stride;
        }
#if defined(__AVX512F__)
        if (common > 0) span[nr](p, p0, common, vr, vs, last, a);
#endif
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t to = std::min(n, len0 + (r0 + i) / groups - p0);
          if (common >= to) continue;
#if defined(__AVX512F__)
          if (simd) {
            const float* pi[1] = {p[i] + common};
            float* ai[1] = {a[i]};
            span[1](pi, p0 + common, to - common, vr + common * vs, vs, last, ai);
            continue;
          }
#endif
          for (int64_t k = common; k < to; ++k) att_axpy(p[i][k], vr + k * vs, d.v_dim, a[i]);
        }
      }
    });
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = (t0 + r / groups) * d.num_heads + kvh * groups + r % groups;
    if (lse) lse[row] = w.max[r] + std::log(w.sum[r]);
    const float inv = 1.0f / w.sum[r];
    float* o = out + row * d.v_dim;
    const float* a = w.acc + r * w.acc_stride;
#if defined(__AVX512F__)
    if (simd) {
      pv_finish(a, d.v_dim, inv, o);
      continue;
    }
#endif
    for (int64_t i = 0; i < d.v_dim; ++i) o[i] = a[i] * inv;
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
  const int64_t items = static_cast<int64_t>(scratch.blocks.size()) * d.num_kv_heads;

#pragma omp parallel
  {
    float* base = scratch.buf.data() + per_thread * omp_get_thread_num();
    const ItemScratch w{base, base + rows * kChunk, base + rows * (kChunk + acc_stride),
                        base + rows * (kChunk + acc_stride + 1), acc_stride};
    // Round-robin items: causal rows grow in cost along the sequence, so contiguous blocks
    // would leave one thread with most of the work. Results do not depend on the schedule.
#pragma omp for schedule(static, 1)
    for (int64_t item = 0; item < items; ++item) {
      const AttentionScratch::Block& b = scratch.blocks[static_cast<size_t>(item / d.num_kv_heads)];
      if (kv.bf16)
        attend_block<uint16_t>(q, kv, seqs[b.seq], b.token, b.count, item % d.num_kv_heads, d, out, lse, w);
      else
        attend_block<float>(q, kv, seqs[b.seq], b.token, b.count, item % d.num_kv_heads, d, out, lse, w);
    }
  }
}

}  // namespace astrai::kernels
