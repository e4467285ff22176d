// The backend interface's contract (backend/ops.h), checked on the CPU backend against plain
// loops written here: what each operation computes, the aliases it allows, and that the paged
// cache path equals the cache-less one. A device backend must pass the same checks against
// the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "backend/ops.h"
#include "random_floats.h"
#if ASTRAI_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif
#include "base/error.h"

namespace astrai::backend {
namespace {

Weight f32_matrix(const std::vector<float>& w, int64_t rows, int64_t cols) {
  return Weight{w.data(), DType::kF32, rows, cols};
}

void expect_near_rel(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << "element " << i;
}

const Ops& ops() { return cpu_ops(); }

TEST(BackendOps, EachDeviceHasItsBackendOrAClearError) {
  EXPECT_EQ(ops().device(), Device::kCpu);
  EXPECT_EQ(&ops_for(Device::kCpu), &cpu_ops());
#if ASTRAI_HAVE_CUDA
  const bool gpu = cuda::available();
#else
  const bool gpu = false;
#endif
  if (gpu) {
    EXPECT_EQ(ops_for(Device::kCuda).device(), Device::kCuda);
    return;
  }
  try {
    ops_for(Device::kCuda);
    FAIL() << "a CUDA backend without a CUDA build or device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
}

TEST(BackendOps, LinearAndItsBackwardMatchPlainLoops) {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 7, 5}, {13, 33, 70}, {64, 16, 129}}) {
    const auto x = randn(static_cast<size_t>(m * k), 1), w = randn(static_cast<size_t>(n * k), 2),
               b = randn(static_cast<size_t>(n), 3), dy = randn(static_cast<size_t>(m * n), 4);
    std::vector<float> y(static_cast<size_t>(m * n));
    ops().linear(x.data(), m, f32_matrix(w, n, k), b.data(), y.data());
    std::vector<double> want(y.size()), dx_want(static_cast<size_t>(m * k)), dw_want(w.size()), db_want(b.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = b[j];
        for (int64_t t = 0; t < k; ++t) s += static_cast<double>(x[i * k + t]) * w[j * k + t];
        want[i * n + j] = s;
        db_want[j] += dy[i * n + j];
        for (int64_t t = 0; t < k; ++t) {
          dx_want[i * k + t] += static_cast<double>(dy[i * n + j]) * w[j * k + t];
          dw_want[j * k + t] += static_cast<double>(dy[i * n + j]) * x[i * k + t];
        }
      }
    expect_near_rel(y, want, 1e-5);
    std::vector<float> dx(dx_want.size(), 0.0f), dw(w.size(), 0.0f), db(b.size(), 0.0f);
    ops().linear_backward(dy.data(), x.data(), m, f32_matrix(w, n, k), dx.data(), false, dw.data(), db.data());
    expect_near_rel(dx, dx_want, 1e-5);
    expect_near_rel(dw, dw_want, 1e-5);
    expect_near_rel(db, db_want, 1e-5);
  }
}

TEST(BackendOps, RmsnormSavesRstdAndTheFusedAddGivesTheSameBits) {
  const int64_t rows = 9, dim = 96;
  const auto x = randn(static_cast<size_t>(rows * dim), 5), delta = randn(x.size(), 6), w = randn(dim, 7);
  const float eps = 1e-6f;
  std::vector<float> y(x.size()), rstd(rows);
  ops().rmsnorm(x.data(), rows, dim, w.data(), eps, y.data(), rstd.data());
  std::vector<double> want(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double rs = 1.0 / std::sqrt(ss / dim + eps);
    EXPECT_NEAR(rstd[r], rs, 1e-5 * rs);
    for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = x[r * dim + i] * rs * w[i];
  }
  expect_near_rel(y, want, 1e-5);
  // Without rstd and in place: the same bits.
  std::vector<float> inplace = x;
  ops().rmsnorm(inplace.data(), rows, dim, w.data(), eps, inplace.data(), nullptr);
  EXPECT_EQ(inplace, y);
  // add_rmsnorm: in place (inference) and into a new buffer with rstd (training) agree with
  // add followed by rmsnorm.
  std::vector<float> sum(x.size()), y_sep(x.size());
  ops().add(x.data(), delta.data(), static_cast<int64_t>(x.size()), sum.data());
  ops().rmsnorm(sum.data(), rows, dim, w.data(), eps, y_sep.data(), nullptr);
  std::vector<float> xa = x, ya(x.size());
  ops().add_rmsnorm(xa.data(), delta.data(), rows, dim, w.data(), eps, xa.data(), ya.data(), nullptr);
  EXPECT_EQ(xa, sum);
  EXPECT_EQ(ya, y_sep);
  std::vector<float> xb(x.size()), yb(x.size()), rb(rows);
  ops().add_rmsnorm(x.data(), delta.data(), rows, dim, w.data(), eps, xb.data(), yb.data(), rb.data());
  EXPECT_EQ(xb, sum);
  EXPECT_EQ(yb, y_sep);
}

TEST(BackendOps, ElementwiseOpsAllowTheirAliases) {
  const int64_t n = 40000;  // above the parallel threshold
  const auto a = randn(n, 8), b = randn(n, 9);
  std::vector<float> sum(n), prod(n), sig(n);
  ops().add(a.data(), b.data(), n, sum.data());
  ops().mul(a.data(), b.data(), n, prod.data());
  ops().sigmoid(a.data(), n, sig.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(sum[i], a[i] + b[i]);
    ASSERT_EQ(prod[i], a[i] * b[i]);
    ASSERT_NEAR(sig[i], 1.0 / (1.0 + std::exp(-static_cast<double>(a[i]))), 1e-6);
  }
  std::vector<float> onto_a = a, onto_b = b;
  ops().add(onto_a.data(), b.data(), n, onto_a.data());
  ops().add(a.data(), onto_b.data(), n, onto_b.data());
  EXPECT_EQ(onto_a, sum);
  EXPECT_EQ(onto_b, sum);
}

TEST(BackendOps, GateBackwardIsTheDerivativeOfAttTimesSigmoid) {
  const int64_t n = 1000;
  const auto att = randn(n, 10), z = randn(n, 11), dy = randn(n, 12);
  std::vector<float> g(n), d_att(n), d_z = dy;
  ops().sigmoid(z.data(), n, g.data());
  ops().gate_backward(d_z.data(), att.data(), g.data(), n, d_att.data(), d_z.data());  // d_z aliases dy
  for (int64_t i = 0; i < n; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(z[i])));
    ASSERT_NEAR(d_att[i], dy[i] * s, 1e-6);
    ASSERT_NEAR(d_z[i], dy[i] * att[i] * s * (1 - s), 1e-6);
  }
}

TEST(BackendOps, RowMovesAreExactAndJoinUndoesSplit) {
  const int64_t rows = 37, kd = 12, vd = 8, dim = kd + vd;
  const auto kvb = randn(static_cast<size_t>(rows * dim), 13);
  std::vector<float> k(static_cast<size_t>(rows * kd)), v(static_cast<size_t>(rows * vd)), back(kvb.size());
  ops().split_rows(kvb.data(), rows, kd, vd, k.data(), v.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < kd; ++i) ASSERT_EQ(k[r * kd + i], kvb[r * dim + i]);
    for (int64_t i = 0; i < vd; ++i) ASSERT_EQ(v[r * vd + i], kvb[r * dim + kd + i]);
  }
  ops().join_rows(k.data(), v.data(), rows, kd, vd, back.data());
  EXPECT_EQ(back, kvb);
  const std::vector<int32_t> pick = {5, 0, 36, 5};
  std::vector<float> out(pick.size() * dim);
  ops().gather_rows(kvb.data(), dim, pick.data(), static_cast<int64_t>(pick.size()), out.data());
  for (size_t r = 0; r < pick.size(); ++r)
    for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(out[r * dim + i], kvb[pick[r] * dim + i]);
}

TEST(BackendOps, EmbeddingAndItsBackward) {
  const int64_t vocab = 11, dim = 70;
  const auto table = randn(static_cast<size_t>(vocab * dim), 14);
  const std::vector<int32_t> ids = {3, 10, 3, 0, 3};
  const auto n = static_cast<int64_t>(ids.size());
  std::vector<float> x(static_cast<size_t>(n * dim));
  ops().embedding(f32_matrix(table, vocab, dim), ids.data(), n, x.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(x[t * dim + i], table[ids[t] * dim + i]);
  const auto dx = randn(x.size(), 15);
  std::vector<float> d_table(table.size(), 0.0f), want(table.size(), 0.0f);
  ops().embedding_backward(dx.data(), ids.data(), n, dim, d_table.data());
  for (int64_t t = 0; t < n; ++t)  // in row order: the same bits
    for (int64_t i = 0; i < dim; ++i) want[ids[t] * dim + i] += dx[t * dim + i];
  EXPECT_EQ(d_table, want);
}

TEST(BackendOps, RopeInverseUndoesTheRotation) {
  const int64_t tokens = 6, heads = 3, hd = 16, half = 4, offset = hd - 2 * half;
  std::vector<double> inv(half);
  for (int64_t f = 0; f < half; ++f) inv[f] = std::pow(10000.0, -2.0 * f / (2 * half));
  const std::vector<int32_t> pos = {0, 1, 2, 7, 100, 3};
  std::vector<float> cos(tokens * half), sin(tokens * half);
  ops().rope_tables(inv.data(), half, pos.data(), tokens, true, 1.0f, cos.data(), sin.data());
  EXPECT_EQ(cos[0], 1.0f);
  EXPECT_NEAR(sin[4 * half], std::sin(100.0f), 1e-6);
  for (auto pairing : {kernels::RopePairing::kHalf, kernels::RopePairing::kAdjacent}) {
    const auto x = randn(static_cast<size_t>(tokens * heads * hd), 16);
    std::vector<float> r = x;
    ops().rope(r.data(), tokens, heads, hd, offset, half, cos.data(), sin.data(), pairing, false);
    EXPECT_NE(r, x);
    for (int64_t t = 0; t < tokens; ++t)  // features before the rotated ones are untouched
      for (int64_t i = 0; i < offset; ++i) ASSERT_EQ(r[t * heads * hd + i], x[t * heads * hd + i]);
    ops().rope(r.data(), tokens, heads, hd, offset, half, cos.data(), sin.data(), pairing, true);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(r[i], x[i], 1e-5);
  }
}

// Attention over two sequences of a packed batch: against a plain softmax, and the paged path
// (K/V written by kv_write, read through page tables) against the cache-less one, bit for bit.
// The training step's operations against their formulas: cross-entropy with label smoothing
// (log-softmax in double) and its gradient written over the logits, ignored rows; squared
// sums per range; scaling; one AdamW update (PyTorch's torch.optim.AdamW, in double); zero.
TEST(BackendOps, TrainingStepOpsMatchTheirFormulas) {
  const int64_t rows = 4, vocab = 37;
  const float eps = 0.1f, scale = 0.5f;
  const auto logits = randn(static_cast<size_t>(rows * vocab), 40, 2.0f);
  const std::vector<int32_t> targets = {3, -100, 36, 0};
  std::vector<float> loss(rows), d = logits;
  const double total = ops().cross_entropy(d.data(), targets.data(), rows, vocab, eps, scale, loss.data(), d.data());
  double want_total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits.data() + r * vocab;
    const int32_t y = targets[static_cast<size_t>(r)];
    if (y < 0) {
      EXPECT_EQ(loss[static_cast<size_t>(r)], 0.0f);
      for (int64_t c = 0; c < vocab; ++c) EXPECT_EQ(d[static_cast<size_t>(r * vocab + c)], 0.0f);
      continue;
    }
    double m = z[0], se = 0.0, sz = 0.0;
    for (int64_t c = 0; c < vocab; ++c) m = std::max(m, static_cast<double>(z[c]));
    for (int64_t c = 0; c < vocab; ++c) se += std::exp(z[c] - m), sz += z[c];
    const double lse = m + std::log(se);
    const double want = (1 - eps) * (lse - z[y]) + eps * (lse - sz / vocab);
    EXPECT_NEAR(loss[static_cast<size_t>(r)], want, 1e-5 * want) << "row " << r;
    want_total += want;
    for (int64_t c = 0; c < vocab; ++c) {
      const double g = scale * (std::exp(z[c] - lse) - eps / vocab - (c == y ? 1 - eps : 0.0));
      EXPECT_NEAR(d[static_cast<size_t>(r * vocab + c)], g, 1e-6) << "row " << r << " column " << c;
    }
  }
  EXPECT_NEAR(total, want_total, 1e-5 * want_total);

  const size_t n = 1000;
  const auto g = randn(n, 41), p = randn(n, 42, 0.1f), m = randn(n, 43, 0.01f);
  std::vector<float> v = randn(n, 44, 0.01f);
  for (float& x : v) x *= x;
  const std::vector<FloatRange> ranges = {{0, 10}, {10, 10}, {10, 999}, {5, 1000}};
  std::vector<double> sums(ranges.size());
  ops().sum_squares(ranges.data(), ranges.size(), g.data(), sums.data());
  for (size_t b = 0; b < ranges.size(); ++b) {
    double want = 0.0;
    for (size_t i = ranges[b].begin; i < ranges[b].end; ++i) want += static_cast<double>(g[i]) * g[i];
    EXPECT_EQ(sums[b], want) << "range " << b;  // the same order: the same double
  }
  std::vector<float> x = g;
  ops().scale(x.data(), n, 0.3f);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(x[i], g[i] * 0.3f);

  // Update 3 of AdamW (lr 1e-2, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1).
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, ae = 1e-8, wd = 0.1;
  AdamWStep st;
  st.beta1 = 0.9f, st.beta2 = 0.95f, st.eps = 1e-8f;
  st.step_size = static_cast<float>(lr / (1 - b1 * b1 * b1));
  st.bc2_sqrt = static_cast<float>(std::sqrt(1 - b2 * b2 * b2));
  st.decay = static_cast<float>(1 - lr * wd);
  std::vector<float> pp = p, mm = m, vv = v;
  ops().adamw(pp.data(), g.data(), mm.data(), vv.data(), n, st);
  for (size_t i = 0; i < n; ++i) {
    const double m1 = b1 * m[i] + (1 - b1) * g[i], v1 = b2 * v[i] + (1 - b2) * g[i] * g[i];
    const double want = p[i] * (1 - lr * wd) - lr / (1 - b1 * b1 * b1) * m1 / (std::sqrt(v1 / (1 - b2 * b2 * b2)) + ae);
    ASSERT_NEAR(mm[i], m1, 1e-6 * (1 + std::fabs(m1))) << i;
    ASSERT_NEAR(vv[i], v1, 1e-6 * (1 + v1)) << i;
    ASSERT_NEAR(pp[i], want, 1e-6 * (1 + std::fabs(want))) << i;
  }
  ops().zero(pp.data(), n);
  EXPECT_EQ(pp, std::vector<float>(n, 0.0f));
}

TEST(BackendOps, AttentionMatchesSoftmaxAndThePagedPathMatchesTheBatchPath) {
  const AttnDims d{4, 2, 8, 6, 1.0f / std::sqrt(8.0f)};
  const std::vector<int32_t> lens = {5, 3};
  const int64_t T = 8;
  const auto q = randn(static_cast<size_t>(T * d.heads * d.qk_dim), 17);
  const auto k = randn(static_cast<size_t>(T * d.kv_heads * d.qk_dim), 18);
  const auto v = randn(static_cast<size_t>(T * d.kv_heads * d.v_dim), 19);
  const std::vector<SeqRange> seqs = {{0, 5, 0, nullptr}, {5, 3, 0, nullptr}};
  std::vector<float> out(static_cast<size_t>(T * d.heads * d.v_dim)), lse(static_cast<size_t>(T * d.heads));
  ops().attention(q.data(), k.data(), v.data(), nullptr, seqs.data(), 2, d, out.data(), lse.data());
  std::vector<double> want(out.size());
  for (const SeqRange& s : seqs)
    for (int64_t i = 0; i < s.num_tokens; ++i)
      for (int64_t h = 0; h < d.heads; ++h) {
        const int64_t row = s.token_begin + i, kvh = h / (d.heads / d.kv_heads);
        std::vector<double> sc(static_cast<size_t>(i + 1));
        double mx = -1e30, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t t = 0; t < d.qk_dim; ++t)
            dot += static_cast<double>(q[(row * d.heads + h) * d.qk_dim + t]) *
                   k[((s.token_begin + j) * d.kv_heads + kvh) * d.qk_dim + t];
          sc[j] = dot * d.scale;
          mx = std::max(mx, sc[j]);
        }
        for (auto& e : sc) sum += (e = std::exp(e - mx));
        EXPECT_NEAR(lse[row * d.heads + h], mx + std::log(sum), 1e-5);
        for (int64_t t = 0; t < d.v_dim; ++t) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += sc[j] / sum * v[((s.token_begin + j) * d.kv_heads + kvh) * d.v_dim + t];
          want[(row * d.heads + h) * d.v_dim + t] = acc;
        }
      }
  expect_near_rel(out, want, 1e-5);

  // The same rows through a paged cache of page size 2, pages out of order.
  const int32_t ps = 2, pages = 8;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<char> kp(static_cast<size_t>(pages * d.kv_heads * ps * d.qk_dim) * dtype_size(dt));
    std::vector<char> vp(static_cast<size_t>(pages * d.kv_heads * ps * d.v_dim) * dtype_size(dt));
    const std::vector<int32_t> table0 = {6, 1, 4}, table1 = {0, 7};
    const std::vector<SeqRange> paged = {{0, 5, 0, table0.data()}, {5, 3, 0, table1.data()}};
    const KvPages kv{kp.data(), vp.data(), ps, dt};
    ops().kv_write(k.data(), v.data(), paged.data(), 2, kv, d.kv_heads, d.qk_dim, d.v_dim);
    std::vector<float> pout(out.size());
    ops().attention(q.data(), nullptr, nullptr, &kv, paged.data(), 2, d, pout.data(), nullptr);
    if (dt == DType::kF32) {
      EXPECT_EQ(pout, out);
    } else {  // bf16 pages: the batch path over the same rounded rows
      auto round = [](std::vector<float> x) {
        for (auto& e : x) e = bf16_to_f32(f32_to_bf16(e));
        return x;
      };
      const auto kr = round(k), vr = round(v);
      std::vector<float> rout(out.size());
      ops().attention(q.data(), kr.data(), vr.data(), nullptr, seqs.data(), 2, d, rout.data(), nullptr);
      EXPECT_EQ(pout, rout);
      EXPECT_NE(pout, out);
    }
  }
}

}  // namespace
}  // namespace astrai::backend
