// The inference-forward kernels against straightforward double-precision references, and
// their invariances (paged vs contiguous K/V, thread count).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"

namespace astrai::kernels {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(Exp, ApproximationIsAccurate) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  x.push_back(0.0f);
  x.push_back(-1000.0f);
  std::vector<float> y(x.size());
  exp_values(x.data(), static_cast<int64_t>(x.size()), y.data());
  double worst = 0;
  for (size_t i = 0; i + 2 < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - want) / want);
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_EQ(y[x.size() - 2], 1.0f);
  EXPECT_LT(y.back(), 1e-37f);
}

TEST(RmsNorm, MatchesDefinition) {
  const int64_t rows = 5, dim = 37;
  auto x = randn(rows * dim, 3), w = randn(dim, 4);
  std::vector<float> y(x.size());
  rmsnorm(x.data(), rows, dim, w.data(), 1e-5f, y.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < dim; ++i) ms += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double rstd = 1.0 / std::sqrt(ms / dim + 1e-5);
    for (int64_t i = 0; i < dim; ++i) EXPECT_NEAR(y[r * dim + i], w[i] * x[r * dim + i] * rstd, 1e-5);
  }
  rmsnorm(x.data(), rows, dim, w.data(), 1e-5f, x.data());  // in place
  EXPECT_EQ(x, y);
}

TEST(Rope, BothPairingsRotateTheRightPairs) {
  const int64_t tokens = 3, heads = 2, stride = 12, offset = 4, half = 4;  // rotate dims [4, 12)
  const std::vector<double> inv = {1.0, 0.3, 0.01, 0.001};
  const std::vector<int32_t> pos = {0, 5, 117};
  std::vector<float> cos(tokens * half), sin(tokens * half);
  rope_sincos(inv.data(), half, pos.data(), tokens, false, cos.data(), sin.data());
  EXPECT_FLOAT_EQ(cos[1 * half + 1], static_cast<float>(std::cos(1.5)));
  for (bool adjacent : {false, true}) {
    auto x = randn(tokens * heads * stride, 5);
    auto y = x;
    rope_rotate(y.data(), tokens, heads, stride, offset, half, cos.data(), sin.data(), adjacent ? RopePairing::kAdjacent : RopePairing::kHalf);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* a = x.data() + (t * heads + h) * stride;
        const float* b = y.data() + (t * heads + h) * stride;
        for (int64_t i = 0; i < offset; ++i) EXPECT_EQ(a[i], b[i]);  // the non-rotated part
        for (int64_t f = 0; f < half; ++f) {
          const int64_t i0 = offset + (adjacent ? 2 * f : f), i1 = offset + (adjacent ? 2 * f + 1 : f + half);
          const double ang = pos[t] * inv[f];
          EXPECT_NEAR(b[i0], a[i0] * std::cos(ang) - a[i1] * std::sin(ang), 1e-5);
          EXPECT_NEAR(b[i1], a[i1] * std::cos(ang) + a[i0] * std::sin(ang), 1e-5);
        }
      }
    }
  }
}

TEST(Activation, SwigluAndGate) {
  auto g = randn(1000, 6, 4.0f), u = randn(1000, 7);
  std::vector<float> out(1000);
  swiglu(g.data(), u.data(), 1000, out.data());
  auto x = u;
  mul_sigmoid(x.data(), g.data(), 1000);
  for (int i = 0; i < 1000; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(g[i])));
    EXPECT_NEAR(out[i], g[i] * s * u[i], 2e-6 * (1 + std::fabs(g[i] * u[i])));
    EXPECT_NEAR(x[i], u[i] * s, 2e-6 * (1 + std::fabs(u[i])));
  }
}

// Batch invariance of the elementwise kernels: an element's result must not depend on where
// it sits in the array (vectorised body, peeled head or scalar tail) nor on the array length.
TEST(Activation, ElementResultsDoNotDependOnPositionOrLength) {
  const int64_t n = 1000;
  auto g = randn(n, 21, 3.0f), u = randn(n, 22);
  std::vector<float> full(n), gate_full = u;
  swiglu(g.data(), u.data(), n, full.data());
  mul_sigmoid(gate_full.data(), g.data(), n);
  for (int64_t off : {1, 3, 7, 13, 16, 17}) {
    for (int64_t len : {1, 5, 31, 64, 500}) {
      std::vector<float> part(len), gate_part(u.begin() + off, u.begin() + off + len);
      swiglu(g.data() + off, u.data() + off, len, part.data());
      mul_sigmoid(gate_part.data(), g.data() + off, len);
      ASSERT_EQ(std::memcmp(part.data(), full.data() + off, len * sizeof(float)), 0) << off << " " << len;
      ASSERT_EQ(std::memcmp(gate_part.data(), gate_full.data() + off, len * sizeof(float)), 0) << off << " " << len;
    }
  }
  // RMSNorm rows: the same row at any row index of any batch.
  const int64_t dim = 40;
  auto x = randn(9 * dim, 23), w = randn(dim, 24);
  std::vector<float> y(9 * dim), y1(dim);
  rmsnorm(x.data(), 9, dim, w.data(), 1e-6f, y.data());
  for (int64_t r = 0; r < 9; ++r) {
    rmsnorm(x.data() + r * dim, 1, dim, w.data(), 1e-6f, y1.data());
    ASSERT_EQ(std::memcmp(y1.data(), y.data() + r * dim, dim * sizeof(float)), 0) << r;
  }
}

// The fused residual add + norm gives the bits of add_inplace followed by rmsnorm, on one
// thread (small) and split over threads (from 8192 elements).
TEST(RmsNorm, FusedAddMatchesAddThenNorm) {
  for (const auto& [rows, dim] : {std::pair<int64_t, int64_t>{1, 40}, {3, 768}, {32, 768}, {17, 1000}}) {
    auto x = randn(rows * dim, 31, 3.0f), delta = randn(rows * dim, 32), w = randn(dim, 33);
    std::vector<float> x_ref = x, y_ref(rows * dim), y(rows * dim);
    add_inplace(x_ref.data(), delta.data(), rows * dim);
    rmsnorm(x_ref.data(), rows, dim, w.data(), 1e-6f, y_ref.data());
    add_rmsnorm(x.data(), delta.data(), rows, dim, w.data(), 1e-6f, y.data());
    EXPECT_EQ(std::memcmp(x.data(), x_ref.data(), x.size() * sizeof(float)), 0) << rows << "x" << dim;
    EXPECT_EQ(std::memcmp(y.data(), y_ref.data(), y.size() * sizeof(float)), 0) << rows << "x" << dim;
  }
}

TEST(Embedding, ConvertsRowsOfEveryDtype) {
  const int64_t vocab = 6, dim = 5;
  auto table = randn(vocab * dim, 8);
  std::vector<uint16_t> bf(table.size()), hf(table.size());
  convert_from_f32(table.data(), DType::kBF16, bf.data(), table.size());
  convert_from_f32(table.data(), DType::kF16, hf.data(), table.size());
  const std::vector<int32_t> ids = {5, 0, 5, 2};
  std::vector<float> out(ids.size() * dim);
  embedding(table.data(), DType::kF32, dim, ids.data(), 4, out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(std::memcmp(out.data() + i * dim, table.data() + ids[i] * dim, dim * sizeof(float)), 0);
  embedding(bf.data(), DType::kBF16, dim, ids.data(), 4, out.data());
  EXPECT_EQ(out[dim], bf16_to_f32(bf[0]));
  embedding(hf.data(), DType::kF16, dim, ids.data(), 4, out.data());
  EXPECT_EQ(out[dim + 1], f16_to_f32(hf[1]));
}

TEST(Softmax, LogSoftmaxNormalises) {
  auto x = randn(300, 9, 10.0f);
  std::vector<float> y(300);
  log_softmax(x.data(), 300, y.data());
  double s = 0;
  for (float v : y) s += std::exp(static_cast<double>(v));
  EXPECT_NEAR(s, 1.0, 1e-5);
  softmax(x.data(), 300, y.data());
  s = 0;
  for (float v : y) s += v;
  EXPECT_NEAR(s, 1.0, 1e-5);
}

// Naive causal attention in double for one sequence whose K/V rows are [len, kv_heads, dim].
std::vector<double> naive_attention(const float* q, const float* k, const float* v, int64_t ctx, int64_t n,
                                    const AttentionDims& d) {
  std::vector<double> out(n * d.num_heads * d.v_dim);
  const int64_t groups = d.num_heads / d.num_kv_heads;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t len = ctx + j + 1;
    for (int64_t h = 0; h < d.num_heads; ++h) {
      const int64_t kvh = h / groups;
      std::vector<double> s(len);
      double m = -1e300;
      for (int64_t t = 0; t < len; ++t) {
        double acc = 0;
        for (int64_t e = 0; e < d.qk_dim; ++e)
          acc += static_cast<double>(q[(j * d.num_heads + h) * d.qk_dim + e]) * k[(t * d.num_kv_heads + kvh) * d.qk_dim + e];
        s[t] = acc * d.scale;
        m = std::max(m, s[t]);
      }
      double z = 0;
      for (auto& x : s) z += (x = std::exp(x - m));
      for (int64_t e = 0; e < d.v_dim; ++e) {
        double acc = 0;
        for (int64_t t = 0; t < len; ++t) acc += s[t] / z * v[(t * d.num_kv_heads + kvh) * d.v_dim + e];
        out[(j * d.num_heads + h) * d.v_dim + e] = acc;
      }
    }
  }
  return out;
}

struct PagedCase {
  int64_t page_size;
  AttentionDims dims;
  int64_t len = 37, ctx = 29;  // positions in all, of which cached before the new tokens
  float ramp = 0.0f;           // K row t scaled by 1 + ramp * t / len: later keys score higher
};

class AttentionPaged : public ::testing::TestWithParam<PagedCase> {};

// Page sizes 8 (even runs), 5 (runs starting at odd positions, the last page partial) and 16,
// pages in shuffled order, must give the same bits as the contiguous run. The head shapes
// vary how query rows are grouped (3 at a time share each K and V load, across tokens of
// different lengths when the group size is not 3) and how many rows the V pass keeps in
// registers (v_dim 80: 2, v_dim 100: 1). The 150-position cases cross the kernel's 64-key
// chunks, with 4-token blocks that start before a chunk boundary and end after it, and
// (ramp) with maxima that grow from chunk to chunk, so the online softmax rescales.
TEST_P(AttentionPaged, ContiguousAndPagedMatchNaiveAndEachOther) {
  const AttentionDims d = GetParam().dims;
  const int64_t len = GetParam().len, ctx = GetParam().ctx, n = len - ctx, ps = GetParam().page_size;
  auto k = randn(len * d.num_kv_heads * d.qk_dim, 10), v = randn(len * d.num_kv_heads * d.v_dim, 11);
  auto q = randn(len * d.num_heads * d.qk_dim, 12);
  for (int64_t t = 0; t < len; ++t)
    for (int64_t e = 0; e < d.num_kv_heads * d.qk_dim; ++e)
      k[t * d.num_kv_heads * d.qk_dim + e] *= 1.0f + GetParam().ramp * static_cast<float>(t) / static_cast<float>(len);

  // Contiguous: the whole sequence as new tokens.
  std::vector<float> out(len * d.num_heads * d.v_dim);
  AttentionSeq seq{0, static_cast<int32_t>(len), 0, nullptr};
  AttentionScratch scratch;
  attention(q.data(), KvSource{k.data(), v.data(), 0}, &seq, 1, d, out.data(), scratch);
  const auto want = naive_attention(q.data(), k.data(), v.data(), 0, len, d);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-5) << i;

  // Paged: the last n tokens are new, K/V of all positions in shuffled pages.
  const int64_t pages = (len + ps - 1) / ps;
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  std::vector<float> kp(pages * ps * d.num_kv_heads * d.qk_dim, NAN), vp(pages * ps * d.num_kv_heads * d.v_dim, NAN);
  for (int64_t t = 0; t < len; ++t) {  // head-major pages: [page][kv head][slot][dim]
    for (int64_t h = 0; h < d.num_kv_heads; ++h) {
      const int64_t at = (table[t / ps] * d.num_kv_heads + h) * ps + t % ps;
      std::memcpy(&kp[at * d.qk_dim], &k[(t * d.num_kv_heads + h) * d.qk_dim], d.qk_dim * sizeof(float));
      std::memcpy(&vp[at * d.v_dim], &v[(t * d.num_kv_heads + h) * d.v_dim], d.v_dim * sizeof(float));
    }
  }
  // Two sequences in one batch: a 1-token dummy first so rows are offset. The new tokens
  // start at an odd position, so they are blocked (4 tokens per work item) differently from
  // the contiguous run above (blocks start at 0, 4, 8, ...): outputs must not change.
  std::vector<float> q2((1 + n) * d.num_heads * d.qk_dim);
  std::memcpy(q2.data() + d.num_heads * d.qk_dim, q.data() + ctx * d.num_heads * d.qk_dim,
              n * d.num_heads * d.qk_dim * sizeof(float));
  const std::vector<int32_t> dummy_table = {2};
  AttentionSeq seqs[2] = {{0, 1, 0, dummy_table.data()}, {1, static_cast<int32_t>(n), static_cast<int32_t>(ctx), table.data()}};
  std::vector<float> out2((1 + n) * d.num_heads * d.v_dim);
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    attention(q2.data(), KvSource{kp.data(), vp.data(), static_cast<int32_t>(ps)}, seqs, 2, d, out2.data(), scratch);
    EXPECT_EQ(std::memcmp(out2.data() + d.num_heads * d.v_dim, out.data() + ctx * d.num_heads * d.v_dim,
                          n * d.num_heads * d.v_dim * sizeof(float)),
              0)
        << threads << " threads";
  }
  omp_set_num_threads(2);

  // bf16 pages: the same bits as f32 pages holding the bf16-rounded values (widening is exact).
  std::vector<uint16_t> kh(kp.size()), vh(vp.size());
  for (size_t i = 0; i < kp.size(); ++i) kp[i] = bf16_to_f32(kh[i] = f32_to_bf16(kp[i]));
  for (size_t i = 0; i < vp.size(); ++i) vp[i] = bf16_to_f32(vh[i] = f32_to_bf16(vp[i]));
  std::vector<float> rounded((1 + n) * d.num_heads * d.v_dim), half((1 + n) * d.num_heads * d.v_dim);
  attention(q2.data(), KvSource{kp.data(), vp.data(), static_cast<int32_t>(ps)}, seqs, 2, d, rounded.data(), scratch);
  attention(q2.data(), KvSource{kh.data(), vh.data(), static_cast<int32_t>(ps), true}, seqs, 2, d, half.data(), scratch);
  EXPECT_EQ(std::memcmp(rounded.data() + d.num_heads * d.v_dim, half.data() + d.num_heads * d.v_dim,
                        n * d.num_heads * d.v_dim * sizeof(float)),
            0);
  float max_diff = 0;  // and close to the unrounded result
  for (int64_t i = 0; i < n * d.num_heads * d.v_dim; ++i)
    max_diff = std::max(max_diff, std::fabs(half[d.num_heads * d.v_dim + i] - out[ctx * d.num_heads * d.v_dim + i]));
  EXPECT_GT(max_diff, 0.0f);
  EXPECT_LT(max_diff, 0.05f);
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndHeads, AttentionPaged,
                         ::testing::Values(PagedCase{8, {6, 2, 24, 20, 0.2f}},     // GQA 3, masked qk and v tails
                                           PagedCase{5, {6, 2, 24, 20, 0.2f}},
                                           PagedCase{5, {8, 2, 32, 80, 0.2f}},     // GQA 4, v 80
                                           PagedCase{8, {4, 2, 16, 100, 0.25f}},   // GQA 2, v 100
                                           PagedCase{5, {3, 3, 40, 16, 0.15f}},   // MHA
                                           PagedCase{16, {12, 4, 64, 64, 0.125f}, 150, 61},
                                           PagedCase{5, {12, 4, 64, 64, 0.125f}, 150, 61, 4.0f},
                                           PagedCase{8, {4, 2, 16, 100, 0.25f}, 150, 93, 4.0f}),
                         [](const ::testing::TestParamInfo<PagedCase>& info) {
                           const PagedCase& c = info.param;
                           return "page" + std::to_string(c.page_size) + "_heads" + std::to_string(c.dims.num_heads) +
                                  "x" + std::to_string(c.dims.num_kv_heads) + "_v" + std::to_string(c.dims.v_dim) +
                                  "_len" + std::to_string(c.len) + (c.ramp > 0 ? "_ramp" : "");
                         });

// Several sequences in one call give each one the bits it gets alone: prefills long enough to
// have their K transposed once per call (v3/v4; each at its own offset of the call's copy), one
// below that length and a decode, over disjoint shuffled pages, f32 and bf16 K/V.
TEST(AttentionBatch, SequencesTogetherEqualEachAlone) {
  const AttentionDims d{12, 4, 64, 64, 0.125f};
  const int64_t ps = 16, kvw = d.num_kv_heads * d.qk_dim;  // q/k dim == v dim: one row width for K and V
  struct Case {
    int64_t len, ctx;
  };
  const std::vector<Case> cases = {{150, 61}, {40, 0}, {77, 76}, {33, 20}, {70, 10}};
  std::vector<std::vector<int32_t>> tables;
  int64_t pages = 0;
  for (const Case& c : cases) {
    std::vector<int32_t> t(static_cast<size_t>((c.len + ps - 1) / ps));
    std::iota(t.begin(), t.end(), static_cast<int32_t>(pages));
    pages += static_cast<int64_t>(t.size());
    tables.push_back(std::move(t));
  }
  std::vector<int32_t> order(static_cast<size_t>(pages));  // every page id to a shuffled place
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  for (auto& t : tables)
    for (auto& p : t) p = order[static_cast<size_t>(p)];
  const auto k = randn(pages * ps * kvw, 30), v = randn(pages * ps * kvw, 31);
  std::vector<uint16_t> kh(k.size()), vh(v.size());
  for (size_t i = 0; i < k.size(); ++i) kh[i] = f32_to_bf16(k[i]), vh[i] = f32_to_bf16(v[i]);
  std::vector<AttentionSeq> seqs;
  int64_t rows = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const int64_t n = cases[i].len - cases[i].ctx;
    seqs.push_back({static_cast<int32_t>(rows), static_cast<int32_t>(n), static_cast<int32_t>(cases[i].ctx),
                    tables[i].data()});
    rows += n;
  }
  const auto q = randn(rows * d.num_heads * d.qk_dim, 32);
  const int64_t qw = d.num_heads * d.qk_dim, ow = d.num_heads * d.v_dim;
  for (bool bf16 : {false, true}) {
    const KvSource kv = bf16 ? KvSource{kh.data(), vh.data(), static_cast<int32_t>(ps), true}
                             : KvSource{k.data(), v.data(), static_cast<int32_t>(ps), false};
    AttentionScratch scratch;
    std::vector<float> together(rows * ow);
    attention(q.data(), kv, seqs.data(), static_cast<int64_t>(seqs.size()), d, together.data(), scratch);
    for (size_t i = 0; i < seqs.size(); ++i) {
      AttentionSeq alone = seqs[i];
      alone.token_begin = 0;
      std::vector<float> out(alone.num_tokens * ow);
      attention(q.data() + seqs[i].token_begin * qw, kv, &alone, 1, d, out.data(), scratch);
      EXPECT_EQ(std::memcmp(out.data(), together.data() + seqs[i].token_begin * ow, out.size() * sizeof(float)), 0)
          << "sequence " << i << (bf16 ? ", bf16" : ", f32");
    }
  }
}

}  // namespace
}  // namespace astrai::kernels
