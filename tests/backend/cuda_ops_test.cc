// The CUDA backend against the CPU backend, op by op, on random inputs and several shapes.
// Built when the CUDA backend is (ASTRAI_HAVE_CUDA); skipped, saying why, on a machine without
// a usable GPU (scripts/gpu-check.sh runs it where there is one).
//
// Tolerances: f32 operations within 1e-4 relative (|got - want| <= 1e-4 (1 + |want|): cuBLAS and
// the kernels sum in other orders and contract multiply-adds; attention and its backward add
// an exp per key); 16-bit weights within 1e-2 when more than 2 rows go through cuBLAS (it
// rounds the activations to the weights' type, the CPU path keeps them in f32), 1e-4 up to 2
// rows (the backend's gemv keeps them in f32 too); moves and copies exact.
#if ASTRAI_HAVE_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/ops.h"
#include "random_floats.h"
#include "tensor/dtype.h"

namespace astrai::backend {
namespace {

// Device copy of host data; back() reads it.
template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& host) : n_(host.size()) {
    p_ = static_cast<T*>(cuda::device_alloc(n_ * sizeof(T)));
    if (n_ > 0) cuda::copy_to_device(p_, host.data(), n_ * sizeof(T));
  }
  explicit Dev(size_t n) : Dev(std::vector<T>(n, T{})) {}
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cuda::device_free(p_); }
  T* p() const { return p_; }
  std::vector<T> back() const {
    std::vector<T> h(n_);
    cuda::synchronize();
    if (n_ > 0) cuda::copy_to_host(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - want[i]), tol * (1.0 + std::fabs(want[i])))
        << what << ": element " << i << " got " << got[i] << " want " << want[i];
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::available(&why)) GTEST_SKIP() << "no GPU here: " << why;
  }
  const Ops& cpu() { return cpu_ops(); }
  const Ops& gpu() { return cuda::ops(); }
  // Cache-less attention of `seqs` (T rows) on both backends: out and lse within 1e-4.
  void expect_attention_close(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                              const std::vector<SeqRange>& seqs, int64_t T, const AttnDims& d, const std::string& what) {
    const int64_t n = static_cast<int64_t>(seqs.size());
    std::vector<float> out(static_cast<size_t>(T * d.heads * d.v_dim)), lse(static_cast<size_t>(T * d.heads));
    cpu().attention(q.data(), k.data(), v.data(), nullptr, seqs.data(), n, d, out.data(), lse.data());
    Dev<float> gq(q), gk(k), gv(v), go(out.size()), gl(lse.size());
    gpu().attention(gq.p(), gk.p(), gv.p(), nullptr, seqs.data(), n, d, go.p(), gl.p());
    expect_close(go.back(), out, 1e-4, what);
    expect_close(gl.back(), lse, 1e-4, what + " lse");
  }
};

TEST_F(CudaOps, IsTheBackendOfCudaMemory) {
  EXPECT_EQ(gpu().device(), Device::kCuda);
  EXPECT_EQ(&ops_for(Device::kCuda), &gpu());
}

TEST_F(CudaOps, LinearF32AndBias) {
  // Rows up to 8 with k a multiple of 8 take the backend's own product (gemv), others cuBLAS.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 96}, {8, 300, 2048}, {7, 33, 70}, {128, 256, 512}}) {
    const auto x = randn(static_cast<size_t>(m * k), 1), w = randn(static_cast<size_t>(n * k), 2, 0.1f),
               b = randn(static_cast<size_t>(n), 3);
    std::vector<float> want(static_cast<size_t>(m * n));
    cpu().linear(x.data(), m, Weight{w.data(), DType::kF32, n, k}, b.data(), want.data());
    Dev<float> dx(x), dw(w), db(b), dy(static_cast<size_t>(m * n));
    gpu().linear(dx.p(), m, Weight{dw.p(), DType::kF32, n, k}, db.p(), dy.p());
    expect_close(dy.back(), want, 1e-4, "linear f32 m=" + std::to_string(m));
  }
}

// 16-bit weights, with and without a bias: 1 and 2 rows through the backend's gemv (f32
// activations, as the CPU: 1e-4), 3, 9 and 40 through cuBLAS (activations rounded to the weights'
// type: 1e-2; with ASTRAI_CUDA_LT=1 cuBLASLt, the bias in its epilogue: scripts/gpu-check.sh
// runs this test both ways).
TEST_F(CudaOps, Linear16BitWeights) {
  for (int64_t m : {1, 2, 3, 9, 40})
  for (DType dt : {DType::kBF16, DType::kF16})
  for (bool with_bias : {false, true}) {
    const int64_t n = 48, k = 160;
    const auto x = randn(static_cast<size_t>(m * k), 4), w = randn(static_cast<size_t>(n * k), 5, 0.1f);
    const auto b = randn(static_cast<size_t>(n), 9);
    std::vector<uint16_t> wh(w.size());
    convert_from_f32(w.data(), dt, wh.data(), w.size());
    std::vector<float> want(static_cast<size_t>(m * n));
    cpu().linear(x.data(), m, Weight{wh.data(), dt, n, k}, with_bias ? b.data() : nullptr, want.data());
    Dev<float> dx(x), dy(static_cast<size_t>(m * n)), db(b);
    Dev<uint16_t> dw(wh);
    gpu().linear(dx.p(), m, Weight{dw.p(), dt, n, k}, with_bias ? db.p() : nullptr, dy.p());
    expect_close(dy.back(), want, m <= 2 ? 1e-4 : 1e-2,
                 "linear " + std::string(dtype_name(dt)) + " m=" + std::to_string(m) + (with_bias ? " +bias" : ""));
  }
}

TEST_F(CudaOps, NormsElementwiseAndMoves) {
  const int64_t rows = 5, dim = 300, n = rows * dim;
  const auto x = randn(n, 6), d = randn(n, 7), w = randn(dim, 8);
  // rmsnorm with rstd, add_rmsnorm, add, mul, sigmoid, swiglu
  std::vector<float> y(n), rstd(rows), xo(n), y2(n), r2(rows), s(n), pr(n), sg(n), sw(n);
  cpu().rmsnorm(x.data(), rows, dim, w.data(), 1e-5f, y.data(), rstd.data());
  cpu().add_rmsnorm(x.data(), d.data(), rows, dim, w.data(), 1e-5f, xo.data(), y2.data(), r2.data());
  cpu().add(x.data(), d.data(), n, s.data());
  cpu().mul(x.data(), d.data(), n, pr.data());
  cpu().sigmoid(x.data(), n, sg.data());
  cpu().swiglu(x.data(), d.data(), n, sw.data());
  Dev<float> gx(x), gd(d), gw(w), gy(n), gr(rows), gxo(n), gy2(n), gr2(rows), gs(n), gp(n), gsg(n), gsw(n);
  gpu().rmsnorm(gx.p(), rows, dim, gw.p(), 1e-5f, gy.p(), gr.p());
  gpu().add_rmsnorm(gx.p(), gd.p(), rows, dim, gw.p(), 1e-5f, gxo.p(), gy2.p(), gr2.p());
  gpu().add(gx.p(), gd.p(), n, gs.p());
  gpu().mul(gx.p(), gd.p(), n, gp.p());
  gpu().sigmoid(gx.p(), n, gsg.p());
  gpu().swiglu(gx.p(), gd.p(), n, gsw.p());
  expect_close(gy.back(), y, 1e-4, "rmsnorm");
  expect_close(gr.back(), rstd, 1e-4, "rstd");
  expect_close(gxo.back(), xo, 0, "add_rmsnorm sum");
  expect_close(gy2.back(), y2, 1e-4, "add_rmsnorm norm");
  expect_close(gs.back(), s, 0, "add");
  expect_close(gp.back(), pr, 0, "mul");
  expect_close(gsg.back(), sg, 1e-5, "sigmoid");
  expect_close(gsw.back(), sw, 1e-5, "swiglu");
  // in place rmsnorm (inference)
  gpu().rmsnorm(gx.p(), rows, dim, gw.p(), 1e-5f, gx.p(), nullptr);
  expect_close(gx.back(), y, 1e-4, "rmsnorm in place");

  // split, join, gather, embedding (f32, bf16) and its backward, copy
  const int64_t kd = 40, vd = 24;
  const auto kvb = randn(static_cast<size_t>(7 * (kd + vd)), 9);
  Dev<float> gkvb(kvb), gk(7 * kd), gv(7 * vd), gj(kvb.size());
  gpu().split_rows(gkvb.p(), 7, kd, vd, gk.p(), gv.p());
  gpu().join_rows(gk.p(), gv.p(), 7, kd, vd, gj.p());
  expect_close(gj.back(), kvb, 0, "join(split(x))");
  const std::vector<int32_t> ids = {3, 0, 3, 9, 1};
  const auto table = randn(10 * dim, 10);
  std::vector<float> emb(ids.size() * dim), gat(ids.size() * dim);
  cpu().embedding(Weight{table.data(), DType::kF32, 10, dim}, ids.data(), 5, emb.data());
  cpu().gather_rows(table.data(), dim, ids.data(), 5, gat.data());
  Dev<float> gt(table), ge(emb.size()), gg(gat.size());
  gpu().embedding(Weight{gt.p(), DType::kF32, 10, dim}, ids.data(), 5, ge.p());
  gpu().gather_rows(gt.p(), dim, ids.data(), 5, gg.p());
  expect_close(ge.back(), emb, 0, "embedding f32");
  expect_close(gg.back(), gat, 0, "gather_rows");
  std::vector<uint16_t> tb(table.size());
  convert_from_f32(table.data(), DType::kBF16, tb.data(), tb.size());
  cpu().embedding(Weight{tb.data(), DType::kBF16, 10, dim}, ids.data(), 5, emb.data());
  Dev<uint16_t> gtb(tb);
  gpu().embedding(Weight{gtb.p(), DType::kBF16, 10, dim}, ids.data(), 5, ge.p());
  expect_close(ge.back(), emb, 0, "embedding bf16");
  const auto dxe = randn(emb.size(), 11);
  std::vector<float> dtab(table.size(), 0.5f);
  cpu().embedding_backward(dxe.data(), ids.data(), 5, dim, dtab.data());
  Dev<float> gdx(dxe), gdt(std::vector<float>(table.size(), 0.5f)), gc(dxe.size());
  gpu().embedding_backward(gdx.p(), ids.data(), 5, dim, gdt.p());
  expect_close(gdt.back(), dtab, 1e-6, "embedding backward");
  gpu().copy(gdx.p(), static_cast<int64_t>(dxe.size()), gc.p());
  expect_close(gc.back(), dxe, 0, "copy");
}

TEST_F(CudaOps, RopeTablesAndRotation) {
  const int64_t tokens = 11, heads = 3, hd = 64, half = 16, offset = hd - 2 * half;
  std::vector<double> inv(half);
  for (int64_t f = 0; f < half; ++f) inv[f] = std::pow(10000.0, -2.0 * f / (2 * half));
  std::vector<int32_t> pos(tokens);
  for (int64_t i = 0; i < tokens; ++i) pos[i] = static_cast<int32_t>(i * 37 % 1000);
  std::vector<float> cos(tokens * half), sin(tokens * half);
  cpu().rope_tables(inv.data(), half, pos.data(), tokens, true, 1.0f, cos.data(), sin.data());
  Dev<float> gcos(cos.size()), gsin(sin.size());
  gpu().rope_tables(inv.data(), half, pos.data(), tokens, true, 1.0f, gcos.p(), gsin.p());
  expect_close(gcos.back(), cos, 0, "rope cos");
  expect_close(gsin.back(), sin, 0, "rope sin");
  for (auto pairing : {kernels::RopePairing::kHalf, kernels::RopePairing::kAdjacent})
    for (bool inverse : {false, true}) {
      auto x = randn(static_cast<size_t>(tokens * heads * hd), 12);
      Dev<float> gx(x);
      cpu().rope(x.data(), tokens, heads, hd, offset, half, cos.data(), sin.data(), pairing, inverse);
      gpu().rope(gx.p(), tokens, heads, hd, offset, half, gcos.p(), gsin.p(), pairing, inverse);
      expect_close(gx.back(), x, 1e-5, "rope");
    }
}

// Attention over a packed batch of three sequences (GQA 8/2, qk 96, v 64): cache-less with the
// log-sum-exp, and through f32 and bf16 pages written by kv_write with a prior context.
TEST_F(CudaOps, AttentionBatchAndPaged) {
  const AttnDims d{8, 2, 96, 64, 1.0f / std::sqrt(96.0f)};
  const std::vector<SeqRange> seqs = {{0, 17, 0, nullptr}, {17, 1, 0, nullptr}, {18, 40, 0, nullptr}};
  const int64_t T = 58;
  const auto q = randn(static_cast<size_t>(T * d.heads * d.qk_dim), 13);
  const auto k = randn(static_cast<size_t>(T * d.kv_heads * d.qk_dim), 14);
  const auto v = randn(static_cast<size_t>(T * d.kv_heads * d.v_dim), 15);
  expect_attention_close(q, k, v, seqs, T, d, "attention");

  // Paged, page size 16: the first 30 positions of one sequence as cached context, then 10 new.
  Dev<float> gq(q), gk(k), gv(v);
  const int32_t ps = 16, pages = 6;
  const std::vector<int32_t> table = {4, 0, 5};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const size_t esz = dtype_size(dt);
    std::vector<char> kp(static_cast<size_t>(pages * d.kv_heads * ps * d.qk_dim) * esz);
    std::vector<char> vp(static_cast<size_t>(pages * d.kv_heads * ps * d.v_dim) * esz);
    const std::vector<SeqRange> ctx = {{0, 30, 0, table.data()}};
    const std::vector<SeqRange> step = {{0, 10, 30, table.data()}};
    const KvPages hkv{kp.data(), vp.data(), ps, dt};
    std::vector<float> pout(static_cast<size_t>(10 * d.heads * d.v_dim));
    cpu().kv_write(k.data(), v.data(), ctx.data(), 1, hkv, d.kv_heads, d.qk_dim, d.v_dim);
    cpu().kv_write(k.data() + 30 * d.kv_heads * d.qk_dim, v.data() + 30 * d.kv_heads * d.v_dim, step.data(), 1, hkv,
                   d.kv_heads, d.qk_dim, d.v_dim);
    cpu().attention(q.data(), nullptr, nullptr, &hkv, step.data(), 1, d, pout.data(), nullptr);
    Dev<char> gkp(std::vector<char>(kp.size(), 0)), gvp(std::vector<char>(vp.size(), 0));
    Dev<float> gpo(pout.size()), gk2(std::vector<float>(k.begin() + 30 * d.kv_heads * d.qk_dim, k.end())),
        gv2(std::vector<float>(v.begin() + 30 * d.kv_heads * d.v_dim, v.end()));
    const KvPages dkv{gkp.p(), gvp.p(), ps, dt};
    gpu().kv_write(gk.p(), gv.p(), ctx.data(), 1, dkv, d.kv_heads, d.qk_dim, d.v_dim);
    gpu().kv_write(gk2.p(), gv2.p(), step.data(), 1, dkv, d.kv_heads, d.qk_dim, d.v_dim);
    EXPECT_EQ(gkp.back(), kp) << "kv_write K pages, " << dtype_name(dt);
    EXPECT_EQ(gvp.back(), vp) << "kv_write V pages, " << dtype_name(dt);
    gpu().attention(gq.p(), nullptr, nullptr, &dkv, step.data(), 1, d, gpo.p(), nullptr);
    expect_close(gpo.back(), pout, 1e-4, "paged attention " + std::string(dtype_name(dt)));
  }
}

// Decode over long contexts, where each (query, head) is split over its keys and the splits
// merged (three sequences of one new token after 0, 699 and 1499 cached positions, f32 and
// bf16 pages), and a batch large enough to run unsplit (one sequence of 200 tokens), each
// against the CPU.
TEST_F(CudaOps, AttentionSplitOverLongContextsAndUnsplitForLargeBatches) {
  const AttnDims d{8, 2, 128, 128, 1.0f / std::sqrt(128.0f)};
  const int32_t ps = 16;
  const std::vector<int32_t> lens = {1, 700, 1500};  // positions each sequence sees, the new one included
  int32_t total = 0, pages = 0;
  for (int32_t l : lens) total += l, pages += (l + ps - 1) / ps;
  const auto k = randn(static_cast<size_t>(total * d.kv_heads * d.qk_dim), 31);
  const auto v = randn(static_cast<size_t>(total * d.kv_heads * d.v_dim), 32);
  const auto q = randn(static_cast<size_t>(3 * d.heads * d.qk_dim), 33);
  // Page tables in reverse page order; the whole sequences written, then one query each.
  std::vector<std::vector<int32_t>> tables;
  int32_t next_page = pages;
  for (int32_t l : lens) {
    tables.emplace_back();
    for (int32_t p = 0; p < (l + ps - 1) / ps; ++p) tables.back().push_back(--next_page);
  }
  std::vector<SeqRange> fill, step;
  int32_t row = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    fill.push_back({row, lens[s], 0, tables[s].data()});
    step.push_back({static_cast<int32_t>(s), 1, lens[s] - 1, tables[s].data()});
    row += lens[s];
  }
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const size_t esz = dtype_size(dt);
    std::vector<char> kp(static_cast<size_t>(pages * d.kv_heads * ps * d.qk_dim) * esz);
    std::vector<char> vp(static_cast<size_t>(pages * d.kv_heads * ps * d.v_dim) * esz);
    const KvPages hkv{kp.data(), vp.data(), ps, dt};
    cpu().kv_write(k.data(), v.data(), fill.data(), 3, hkv, d.kv_heads, d.qk_dim, d.v_dim);
    std::vector<float> out(static_cast<size_t>(3 * d.heads * d.v_dim)), lse(static_cast<size_t>(3 * d.heads));
    cpu().attention(q.data(), nullptr, nullptr, &hkv, step.data(), 3, d, out.data(), lse.data());
    Dev<char> gkp(kp), gvp(vp);
    Dev<float> gq(q), go(out.size()), gl(lse.size());
    const KvPages dkv{gkp.p(), gvp.p(), ps, dt};
    gpu().attention(gq.p(), nullptr, nullptr, &dkv, step.data(), 3, d, go.p(), gl.p());
    expect_close(go.back(), out, 1e-4, "split attention " + std::string(dtype_name(dt)));
    expect_close(gl.back(), lse, 1e-4, "split attention lse " + std::string(dtype_name(dt)));
  }

  const int32_t T = 200;
  const std::vector<SeqRange> one = {{0, T, 0, nullptr}};
  const auto pq = randn(static_cast<size_t>(T * d.heads * d.qk_dim), 34);
  expect_attention_close(pq, k, v, one, T, d, "unsplit attention");
}

TEST_F(CudaOps, Backwards) {
  // linear_backward (accumulating dx and dw onto existing values)
  const int64_t m = 19, n = 72, k = 40;
  const auto x = randn(static_cast<size_t>(m * k), 16), w = randn(static_cast<size_t>(n * k), 17),
             dy = randn(static_cast<size_t>(m * n), 18);
  std::vector<float> dx(static_cast<size_t>(m * k), 1.0f), dw(w.size(), 0.25f), db(n, 0.5f);
  cpu().linear_backward(dy.data(), x.data(), m, Weight{w.data(), DType::kF32, n, k}, dx.data(), true, dw.data(),
                        db.data());
  Dev<float> gx(x), gw(w), gdy(dy), gdx(std::vector<float>(dx.size(), 1.0f)), gdw(std::vector<float>(w.size(), 0.25f)),
      gdb(std::vector<float>(n, 0.5f));
  gpu().linear_backward(gdy.p(), gx.p(), m, Weight{gw.p(), DType::kF32, n, k}, gdx.p(), true, gdw.p(), gdb.p());
  expect_close(gdx.back(), dx, 1e-4, "linear backward dx");
  expect_close(gdw.back(), dw, 1e-4, "linear backward dw");
  expect_close(gdb.back(), db, 1e-4, "linear backward db");

  // rmsnorm_backward, dx aliasing dy
  const int64_t rows = 6, dim = 130;
  const auto xr = randn(rows * dim, 19), wr = randn(dim, 20), dyr = randn(rows * dim, 21);
  std::vector<float> yr(rows * dim), rstd(rows), dxr = dyr, dwr(dim, 0.0f);
  cpu().rmsnorm(xr.data(), rows, dim, wr.data(), 1e-6f, yr.data(), rstd.data());
  cpu().rmsnorm_backward(dxr.data(), xr.data(), wr.data(), rstd.data(), rows, dim, dxr.data(), false, dwr.data());
  Dev<float> gxr(xr), gwr(wr), grs(rstd), gdxr(dyr), gdwr(std::vector<float>(dim, 0.0f));
  gpu().rmsnorm_backward(gdxr.p(), gxr.p(), gwr.p(), grs.p(), rows, dim, gdxr.p(), false, gdwr.p());
  expect_close(gdxr.back(), dxr, 1e-4, "rmsnorm backward dx");
  expect_close(gdwr.back(), dwr, 1e-4, "rmsnorm backward dw");

  // swiglu and gate backward
  const int64_t e = 5000;
  const auto a = randn(e, 22), b = randn(e, 23), dh = randn(e, 24);
  std::vector<float> da(e), dbb(e), g(e), datt(e), dz(e);
  cpu().swiglu_backward(dh.data(), a.data(), b.data(), e, da.data(), dbb.data());
  cpu().sigmoid(b.data(), e, g.data());
  cpu().gate_backward(dh.data(), a.data(), g.data(), e, datt.data(), dz.data());
  Dev<float> ga(a), gb(b), gdh(dh), gda(e), gdbb(e), gg(g), gdatt(e), gdz(e);
  gpu().swiglu_backward(gdh.p(), ga.p(), gb.p(), e, gda.p(), gdbb.p());
  gpu().gate_backward(gdh.p(), ga.p(), gg.p(), e, gdatt.p(), gdz.p());
  expect_close(gda.back(), da, 1e-5, "swiglu backward da");
  expect_close(gdbb.back(), dbb, 1e-5, "swiglu backward db");
  expect_close(gdatt.back(), datt, 1e-6, "gate backward d_att");
  expect_close(gdz.back(), dz, 1e-6, "gate backward d_z");
}

TEST_F(CudaOps, AttentionBackward) {
  const AttnDims d{6, 3, 32, 48, 1.0f / std::sqrt(32.0f)};
  const std::vector<SeqRange> docs = {{0, 21, 0, nullptr}, {21, 9, 0, nullptr}};
  const int64_t T = 30;
  const auto q = randn(static_cast<size_t>(T * d.heads * d.qk_dim), 25);
  const auto k = randn(static_cast<size_t>(T * d.kv_heads * d.qk_dim), 26);
  const auto v = randn(static_cast<size_t>(T * d.kv_heads * d.v_dim), 27);
  const auto dout = randn(static_cast<size_t>(T * d.heads * d.v_dim), 28);
  std::vector<float> out(dout.size()), lse(static_cast<size_t>(T * d.heads)), dq(q.size()), dk(k.size()), dv(v.size());
  cpu().attention(q.data(), k.data(), v.data(), nullptr, docs.data(), 2, d, out.data(), lse.data());
  cpu().attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), docs.data(), 2, d,
                           dq.data(), dk.data(), dv.data());
  Dev<float> gq(q), gk(k), gv(v), gdo(dout), go(out), gl(lse), gdq(q.size()), gdk(k.size()), gdv(v.size());
  gpu().attention_backward(gdo.p(), gq.p(), gk.p(), gv.p(), go.p(), gl.p(), docs.data(), 2, d, gdq.p(), gdk.p(),
                           gdv.p());
  expect_close(gdq.back(), dq, 1e-4, "attention backward dq");
  expect_close(gdk.back(), dk, 1e-4, "attention backward dk");
  expect_close(gdv.back(), dv, 1e-4, "attention backward dv");
}

// The training step's own operations: cross-entropy (label smoothing, ignored rows, the
// gradient written over the logits), the gradient's squared norm per range, scaling, AdamW
// and zeroing. Sums run in a tree on the GPU: losses within 1e-5 relative, the rest 1e-5/1e-6.
TEST_F(CudaOps, TrainingStepOps) {
  for (auto [rows, vocab, smoothing] : {std::tuple<int64_t, int64_t, float>{7, 97, 0.0f}, {5, 1000, 0.1f}, {3, 4099, 0.05f}}) {
    const auto logits = randn(static_cast<size_t>(rows * vocab), 30, 3.0f);
    std::vector<int32_t> targets(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) targets[static_cast<size_t>(r)] = r == 1 ? -100 : static_cast<int32_t>((r * 37) % vocab);
    std::vector<float> loss(static_cast<size_t>(rows)), dlogits(logits.size());
    const double want = cpu().cross_entropy(logits.data(), targets.data(), rows, vocab, smoothing, 0.25f, loss.data(),
                                            dlogits.data());
    Dev<float> gl(logits), grl(static_cast<size_t>(rows));
    const double got_eval = gpu().cross_entropy(gl.p(), targets.data(), rows, vocab, smoothing, 0.0f, grl.p(), nullptr);
    const double got = gpu().cross_entropy(gl.p(), targets.data(), rows, vocab, smoothing, 0.25f, grl.p(), gl.p());
    const std::string what = "cross_entropy vocab " + std::to_string(vocab);
    EXPECT_NEAR(got_eval, want, 1e-5 * std::fabs(want)) << what;
    EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << what;
    expect_close(grl.back(), loss, 1e-5, what + " row losses");
    expect_close(gl.back(), dlogits, 1e-6, what + " dlogits (over the logits)");
  }

  const size_t n = 200003;
  const auto g = randn(n, 31), p = randn(n, 32, 0.05f), m = randn(n, 33, 0.01f);
  auto v = randn(n, 34, 0.01f);
  for (float& x : v) x = x * x;  // second moments are not negative
  const std::vector<FloatRange> ranges = {{0, 65536}, {65536, 65536}, {65536, 131072}, {131072, 200003}, {17, 33}};
  std::vector<double> want(ranges.size()), got(ranges.size());
  cpu().sum_squares(ranges.data(), ranges.size(), g.data(), want.data());
  Dev<float> gg(g);
  gpu().sum_squares(ranges.data(), ranges.size(), gg.p(), got.data());
  for (size_t b = 0; b < ranges.size(); ++b) EXPECT_NEAR(got[b], want[b], 1e-12 * (1.0 + want[b])) << "range " << b;

  std::vector<float> scaled = g;
  cpu().scale(scaled.data(), n, 0.37f);
  gpu().scale(gg.p(), n, 0.37f);
  expect_close(gg.back(), scaled, 0.0, "scale");

  for (float decay : {1.0f, 1.0f - 1e-3f * 0.1f}) {
    AdamWStep st;
    st.step_size = 1e-3f / (1.0f - 0.9f * 0.9f * 0.9f);
    st.bc2_sqrt = std::sqrt(1.0f - 0.95f * 0.95f * 0.95f);
    st.decay = decay;
    std::vector<float> pc = p, mc = m, vc = v;
    cpu().adamw(pc.data(), g.data(), mc.data(), vc.data(), n, st);
    Dev<float> gp(p), gm(m), gv(v), gg2(g);
    gpu().adamw(gp.p(), gg2.p(), gm.p(), gv.p(), n, st);
    expect_close(gm.back(), mc, 1e-6, "adamw m");
    expect_close(gv.back(), vc, 1e-6, "adamw v");
    expect_close(gp.back(), pc, 1e-6, "adamw parameters");
  }

  Dev<float> z(p);
  gpu().zero(z.p(), n);
  expect_close(z.back(), std::vector<float>(n, 0.0f), 0.0, "zero");
}

// Sampling next to the logits (backend/sample_rows.h, one block per row on the GPU): the CPU
// backend's tokens and alternatives exactly, for rows of several widths and shapes (spread,
// peaked, ties) under every filter; logprobs within one float ulp (the lse's log() of a double
// is the device math library's, which may differ from the host's in its last bit).
TEST_F(CudaOps, SampleEqualsTheCpuBackend) {
  std::mt19937_64 rng(21);
  for (int64_t vocab : {7, 1000, 32000, 151936}) {
    const int64_t rows = 4;
    std::vector<float> logits = randn(static_cast<size_t>(rows * vocab), 40 + vocab, 3.0f);
    for (int64_t i = 0; i < vocab; ++i) logits[static_cast<size_t>(vocab + i)] *= 4.0f;  // row 1 peaked
    for (int64_t i = 0; i < vocab; ++i)  // row 2: ties
      logits[static_cast<size_t>(2 * vocab + i)] = std::round(logits[static_cast<size_t>(2 * vocab + i)] / 3.0f);
    std::vector<SampleSpec> specs;
    const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    const int32_t ks[] = {0, 1, 40};
    const float ps[] = {1.0f, 0.9f, 0.5f};
    const float mins[] = {0.0f, 0.1f};
    for (int k = 0; k < 40; ++k) {
      SampleSpec s;
      s.row = k % rows;
      s.temperature = temps[rng() % 4];
      s.top_k = ks[rng() % 3];
      s.top_p = ps[rng() % 3];
      s.min_p = mins[rng() % 2];
      s.top_logprobs = static_cast<int32_t>(rng() % 22) - 1;
      s.uniform = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      specs.push_back(s);
    }
    const int64_t n = static_cast<int64_t>(specs.size());
    std::vector<SampleResult> want(specs.size()), got(specs.size());
    cpu().sample(logits.data(), rows, vocab, specs.data(), n, want.data());
    Dev<float> gl(logits);
    gpu().sample(gl.p(), rows, vocab, specs.data(), n, got.data());
    for (size_t k = 0; k < specs.size(); ++k) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " spec " << k << ": temperature "
                                        << specs[k].temperature << " top_k " << specs[k].top_k << " top_p "
                                        << specs[k].top_p << " min_p " << specs[k].min_p);
      EXPECT_EQ(got[k].token, want[k].token);
      ASSERT_EQ(got[k].num_top, want[k].num_top);
      if (specs[k].top_logprobs >= 0)
        EXPECT_NEAR(got[k].logprob, want[k].logprob, 1.2e-7 * (1.0 + std::fabs(want[k].logprob)));
      for (int32_t r = 0; r < want[k].num_top; ++r) {
        EXPECT_EQ(got[k].top_ids[r], want[k].top_ids[r]) << "entry " << r;
        EXPECT_NEAR(got[k].top_logprobs[r], want[k].top_logprobs[r], 1.2e-7 * (1.0 + std::fabs(want[k].top_logprobs[r])));
      }
    }
  }
}

}  // namespace
}  // namespace astrai::backend

#endif  // ASTRAI_HAVE_CUDA
