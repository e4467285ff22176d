// kernels::linear against a double-precision reference, and batch invariance (bit identity of
// a row computed alone vs inside larger batches).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/gemm_mode.h"
#include "kernels/cpu/matmul.h"
#include "tensor/dtype.h"

namespace astrai::kernels {
namespace {

// Sets the activations mode of quantized weights for a scope (the default is q8).
struct ScopedActivations {
  explicit ScopedActivations(Activations a) : saved(activations()) { set_activations(a); }
  ~ScopedActivations() { set_activations(saved); }
  Activations saved;
};

// Sets the bf16-dot mode for a scope (off by default).
struct ScopedBf16Dot {
  explicit ScopedBf16Dot(bool on) : saved(bf16_dot()) { set_bf16_dot(on); }
  ~ScopedBf16Dot() { set_bf16_dot(saved); }
  bool saved;
};

struct Weights {
  DType dtype;
  int64_t n, k;
  std::vector<uint8_t> bytes;   // as stored
  std::vector<double> values;   // exactly what the stored elements mean
  WeightView view() const { return WeightView{bytes.data(), dtype, n, k}; }
};

Weights make_weights(DType dtype, int64_t n, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.5f);
  Weights w{dtype, n, k, std::vector<uint8_t>(static_cast<size_t>(n * k) * dtype_size(dtype)), {}};
  w.values.resize(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) {
    const float f = dist(rng);
    if (dtype == DType::kF32) {
      std::memcpy(w.bytes.data() + 4 * i, &f, 4);
      w.values[i] = f;
    } else {
      const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
      std::memcpy(w.bytes.data() + 2 * i, &h, 2);
      w.values[i] = dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return w;
}

std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& f : v) f = dist(rng);
  return v;
}

// Checks y against the double reference: |y - ref| <= tol * sum_k |x * w| (+ |bias|), the
// natural bound for an f32 dot product of length K (error grows with sqrt(K)..K ulps).
void expect_close(const std::vector<float>& x, int64_t m, const Weights& w, const std::vector<float>* bias,
                  const std::vector<float>& y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < w.k; ++k) {
        const double p = static_cast<double>(x[i * w.k + k]) * w.values[j * w.k + k];
        ref += p;
        mag += std::fabs(p);
      }
      if (bias) {
        ref += (*bias)[j];
        mag += std::fabs((*bias)[j]);
      }
      const double tol = 4e-7 * (mag + 1e-30) * (1.0 + std::sqrt(static_cast<double>(w.k)));
      ASSERT_NEAR(y[i * w.n + j], ref, tol) << "row " << i << " col " << j << " M=" << m << " N=" << w.n
                                            << " K=" << w.k << " dtype=" << dtype_name(w.dtype);
    }
  }
}

class LinearDtypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearDtypeTest, MatchesDoubleReferenceOnRandomShapes) {
  std::mt19937 rng(1234 + static_cast<int>(GetParam()));
  const int64_t ks[] = {1, 7, 16, 17, 33, 64, 100, 255, 768};
  const int64_t ns[] = {1, 3, 15, 16, 31, 48, 97, 130};
  std::uniform_int_distribution<int> pick_k(0, std::size(ks) - 1), pick_n(0, std::size(ns) - 1);
  for (int64_t m = 1; m <= 40; ++m) {
    const int64_t k = ks[pick_k(rng)], n = ns[pick_n(rng)];
    const Weights w = make_weights(GetParam(), n, k, rng);
    const auto x = random_vec(static_cast<size_t>(m * k), rng);
    const auto bias = random_vec(static_cast<size_t>(n), rng);
    const bool with_bias = m % 2 == 0;
    std::vector<float> y(static_cast<size_t>(m * n), std::nanf(""));
    linear(x.data(), m, w.view(), with_bias ? bias.data() : nullptr, y.data());
    expect_close(x, m, w, with_bias ? &bias : nullptr, y);
  }
}

TEST_P(LinearDtypeTest, LargeShapesMatchReference) {
  std::mt19937 rng(99);
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{67, 259, 300}, {130, 77, 1031}, {512, 64, 128}}) {
    const Weights w = make_weights(GetParam(), n, k, rng);
    const auto x = random_vec(static_cast<size_t>(m * k), rng);
    const auto bias = random_vec(static_cast<size_t>(n), rng);
    std::vector<float> y(static_cast<size_t>(m * n));
    linear(x.data(), m, w.view(), bias.data(), y.data());
    expect_close(x, m, w, &bias, y);
  }
}

// Row i of x computed alone (M=1), inside M=37 and inside M=512 (other rows random) must give
// the same bits: the inference engine's greedy output depends on it.
TEST_P(LinearDtypeTest, RowsAreBitIdenticalWhateverTheBatch) {
  std::mt19937 rng(7);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{129, 203}, {768, 768}, {50, 2048}, {1000, 64}, {40, 2500}}) {
    const Weights w = make_weights(GetParam(), n, k, rng);
    const auto bias = random_vec(static_cast<size_t>(n), rng);
    const auto big = random_vec(static_cast<size_t>(512 * k), rng);
    std::vector<float> y512(static_cast<size_t>(512 * n));
    linear(big.data(), 512, w.view(), bias.data(), y512.data());
    for (const int64_t m : {1, 2, 3, 5, 8, 9, 32, 37, 64, 100}) {  // 32-64 with K = 2048: x re-strided
      for (const int64_t offset : {int64_t{0}, int64_t{13}, 512 - m}) {
        if (offset + m > 512) continue;
        std::vector<float> y(static_cast<size_t>(m * n));
        linear(big.data() + offset * k, m, w.view(), bias.data(), y.data());
        ASSERT_EQ(0, std::memcmp(y.data(), y512.data() + offset * n, y.size() * sizeof(float)))
            << "M=" << m << " offset=" << offset << " N=" << n << " K=" << k;
      }
    }
    // A single row inside a batch of 37 whose other rows differ.
    for (const int64_t row : {int64_t{0}, int64_t{17}, int64_t{36}}) {
      auto x37 = random_vec(static_cast<size_t>(37 * k), rng);
      std::memcpy(x37.data() + row * k, big.data() + 200 * k, static_cast<size_t>(k) * sizeof(float));
      std::vector<float> y37(static_cast<size_t>(37 * n)), y1(static_cast<size_t>(n));
      linear(x37.data(), 37, w.view(), bias.data(), y37.data());
      linear(big.data() + 200 * k, 1, w.view(), bias.data(), y1.data());
      ASSERT_EQ(0, std::memcmp(y1.data(), y37.data() + row * n, y1.size() * sizeof(float))) << "row " << row;
      ASSERT_EQ(0, std::memcmp(y1.data(), y512.data() + 200 * n, y1.size() * sizeof(float)));
    }
  }
}

// The bf16-dot mode (kernels/cpu/linear_bf16.h): bf16 weights times the activations rounded to
// bf16, within an f32 dot product's error of the double sum of exactly those products, and
// different from the default mode (which multiplies the unrounded activations).
TEST(LinearBf16Dot, MatchesDoubleReferenceOfRoundedActivations) {
  ScopedBf16Dot on(true);
  std::mt19937 rng(4321);
  const int64_t ks[] = {1, 2, 31, 32, 33, 100, 768, 1025, 2100};
  const int64_t ns[] = {1, 7, 8, 9, 16, 31, 130};
  std::uniform_int_distribution<int> pick_k(0, std::size(ks) - 1), pick_n(0, std::size(ns) - 1);
  int differ = 0;
  for (const int64_t m : {1, 2, 3, 4, 5, 8, 9, 13, 40, 200}) {
    const int64_t k = ks[pick_k(rng)], n = ns[pick_n(rng)];
    const Weights w = make_weights(DType::kBF16, n, k, rng);
    const auto x = random_vec(static_cast<size_t>(m * k), rng);
    std::vector<float> rounded(x.size());
    for (size_t e = 0; e < x.size(); ++e) rounded[e] = bf16_to_f32(f32_to_bf16(x[e]));
    const auto bias = random_vec(static_cast<size_t>(n), rng);
    std::vector<float> y(static_cast<size_t>(m * n), std::nanf("")), exact(y.size());
    linear(x.data(), m, w.view(), bias.data(), y.data());
    expect_close(rounded, m, w, &bias, y);
    {
      ScopedBf16Dot off(false);
      linear(x.data(), m, w.view(), bias.data(), exact.data());
    }
    differ += std::memcmp(y.data(), exact.data(), y.size() * sizeof(float)) != 0;
  }
  EXPECT_GT(differ, 5) << "the mode should change most results (the activations are rounded)";
}

// Denormals as VDPBF16PS treats them: a bf16 denormal operand counts as zero (DAZ), a denormal
// result is flushed (FTZ). The default mode keeps both.
TEST(LinearBf16Dot, FlushesDenormalsAsTheInstruction) {
  const auto bits = [](float f) { return f32_to_bf16(f); };
  const float tiny = std::ldexp(1.0f, -70);  // tiny * tiny = 2^-140, an f32 denormal
  struct Case {
    float x0, x1;
    uint16_t w0, w1;
  };
  for (const Case& c : {Case{tiny, 0.0f, bits(tiny), 0}, Case{-tiny, 0.0f, bits(tiny), 0},
                        Case{std::ldexp(1.0f, -130), 0.0f, bits(1.0f), 0},       // x a denormal
                        Case{1.0f, 0.0f, static_cast<uint16_t>(0x0001), 0}}) {  // w a denormal
    const float x[2] = {c.x0, c.x1};
    const uint16_t w[2] = {c.w0, c.w1};
    const WeightView wv{w, DType::kBF16, 1, 2};
    float dot = -1.0f, exact = -1.0f;
    {
      ScopedBf16Dot on(true);
      linear(x, 1, wv, nullptr, &dot);
    }
    {
      ScopedBf16Dot off(false);
      linear(x, 1, wv, nullptr, &exact);
    }
    EXPECT_EQ(dot, 0.0f) << "x0 " << c.x0 << " w0 " << c.w0;
    EXPECT_NE(exact, 0.0f) << "x0 " << c.x0 << " w0 " << c.w0;
  }
}

// A row's bits do not depend on the batch in the bf16-dot mode either (the tiles for few rows,
// the blocked order for many, several row blocks at 512).
TEST(LinearBf16Dot, RowsAreBitIdenticalWhateverTheBatch) {
  ScopedBf16Dot on(true);
  std::mt19937 rng(8);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{129, 203}, {50, 2048}, {40, 2500}}) {
    const Weights w = make_weights(DType::kBF16, n, k, rng);
    const auto bias = random_vec(static_cast<size_t>(n), rng);
    const auto big = random_vec(static_cast<size_t>(512 * k), rng);
    std::vector<float> y512(static_cast<size_t>(512 * n));
    linear(big.data(), 512, w.view(), bias.data(), y512.data());
    for (const int64_t m : {1, 2, 3, 5, 8, 9, 37, 193}) {
      for (const int64_t offset : {int64_t{0}, int64_t{13}, 512 - m}) {
        std::vector<float> y(static_cast<size_t>(m * n));
        linear(big.data() + offset * k, m, w.view(), bias.data(), y.data());
        ASSERT_EQ(0, std::memcmp(y.data(), y512.data() + offset * n, y.size() * sizeof(float)))
            << "M=" << m << " offset=" << offset << " N=" << n << " K=" << k;
      }
    }
  }
}

// The non-invariant mode (BLAS for many rows) computes the same function.
TEST_P(LinearDtypeTest, BlasModeMatchesReference) {
  std::mt19937 rng(2024);
  ASSERT_TRUE(batch_invariant());  // the default
  set_batch_invariant(false);
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 33, 70}, {8, 40, 100}, {16, 65, 129},
                                {40, 130, 300}, {300, 17, 64}}) {
    const Weights w = make_weights(GetParam(), n, k, rng);
    const auto x = random_vec(static_cast<size_t>(m * k), rng);
    const auto bias = random_vec(static_cast<size_t>(n), rng);
    std::vector<float> y(static_cast<size_t>(m * n));
    linear(x.data(), m, w.view(), bias.data(), y.data());
    expect_close(x, m, w, &bias, y);
    linear(x.data(), m, w.view(), nullptr, y.data());
    expect_close(x, m, w, nullptr, y);
  }
  set_batch_invariant(true);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearDtypeTest, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Q8_0 and Q4_0 weights are widened exactly ((q - zero) * d), Q4_K and Q5_K ones to (d * sc) * q -
// dmin * m and Q6_K ones to (d * scale) * (q - 32) (one rounding each), and then follow the f32 contract,
// so the quantized linear equals the f32 linear on the dequantized weights bit for bit, on every
// path (the k-quants: K across the 1024 blocks of the contract, whole and partial).
TEST(LinearBlocks, EqualsF32LinearOnDequantizedWeights) {
  ScopedActivations mode(Activations::kF32);
  std::mt19937 rng(7);
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K})
  for (int64_t m : {1, 2, 3, 5, 8, 16, 33, 64, 65, 150}) {
    // Q5_K, Q6_K: the same paths with fewer row counts (their generic references decode per row: CI time).
    if ((dt == DType::kQ5_K || dt == DType::kQ6_K) && (m == 33 || m == 150)) continue;
    const std::vector<int64_t> ks = block_elems(dt) == kQKBlock ? std::vector<int64_t>{256, 512, 1024, 1280, 2304}
                                                       : std::vector<int64_t>{32, 64, 96, 1024, 2112};
    for (int64_t k : ks) {
      for (int64_t n : {1, 7, 24, 61}) {
        const auto x = random_vec(static_cast<size_t>(m * k), rng);
        const auto wf = random_vec(static_cast<size_t>(n * k), rng);
        const auto bias = random_vec(static_cast<size_t>(n), rng);
        std::vector<uint8_t> wq(dtype_bytes(dt, n * k));
        convert_from_f32(wf.data(), dt, wq.data(), wf.size());
        std::vector<float> wd(wf.size());
        convert_to_f32(dt, wq.data(), wd.data(), wd.size());
        std::vector<float> yq(static_cast<size_t>(m * n), NAN), yf(yq.size(), NAN);
        linear(x.data(), m, WeightView{wq.data(), dt, n, k}, bias.data(), yq.data());
        linear(x.data(), m, WeightView{wd.data(), DType::kF32, n, k}, bias.data(), yf.data());
        ASSERT_EQ(std::memcmp(yq.data(), yf.data(), yq.size() * 4), 0)
            << dtype_name(dt) << " M=" << m << " N=" << n << " K=" << k;
      }
    }
  }
}

// The q8 activation mode (kernels/cpu/linear_int8.h) against double-precision references:
//  - activations that quantize exactly (integers in [-127, 127], each block holding +-127, so
//    d = 1 and q = x): y equals sum(w * x) over the dequantized weights up to the f32 chain's
//    roundings;
//  - random activations: y differs from the exact product by no more than the activations'
//    rounding allows, sum over blocks of (d_x / 2) * sum |w| (plus the same f32 slack);
//  - batch invariance: a row alone gives the bits it gives inside any batch.

TEST(LinearBlocks, Q8ActivationsAgainstDoubleReference) {
  ScopedActivations mode(Activations::kQ8);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> ints(-127, 127);
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const int64_t blk = block_elems(dt) == kQKBlock ? kQKBlock : kQBlock;  // activation block
    for (int64_t m : {1, 3, 6}) {
      for (int64_t k : {int64_t{256}, int64_t{768}, int64_t{2048}}) {
        for (int64_t n : {5, 16, 40}) {
          const auto wf = random_vec(static_cast<size_t>(n * k), rng);
          std::vector<uint8_t> wq(dtype_bytes(dt, n * k));
          convert_from_f32(wf.data(), dt, wq.data(), wf.size());
          std::vector<float> wd(wf.size());
          convert_to_f32(dt, wq.data(), wd.data(), wd.size());
          for (bool exact : {true, false}) {
            std::vector<float> x(static_cast<size_t>(m * k));
            if (exact) {
              for (auto& v : x) v = static_cast<float>(ints(rng));
              for (int64_t b = 0; b < m * k; b += blk) x[static_cast<size_t>(b + ints(rng) % 7 + 7)] = ints(rng) < 0 ? -127.0f : 127.0f;
            } else {
              x = random_vec(x.size(), rng);
            }
            std::vector<float> y(static_cast<size_t>(m * n), NAN);
            linear(x.data(), m, WeightView{wq.data(), dt, n, k}, nullptr, y.data());
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double want = 0, mag = 0, bound = 0;
                for (int64_t b = 0; b < k; b += blk) {
                  double amax = 0, wabs = 0;
                  for (int64_t e = b; e < b + blk; ++e) {
                    const double xv = x[static_cast<size_t>(i * k + e)], wv = wd[static_cast<size_t>(j * k + e)];
                    want += xv * wv;
                    mag += std::fabs(xv * wv);
                    amax = std::max(amax, std::fabs(xv));
                    wabs += std::fabs(wv);
                  }
                  bound += exact ? 0.0 : amax / 127.0 / 2.0 * (1.0 + 1e-5) * wabs;
                }
                const double got = y[static_cast<size_t>(i * n + j)];
                EXPECT_LE(std::fabs(got - want), bound + 4e-6 * (mag + bound))
                    << dtype_name(dt) << (exact ? " exact" : " random") << " M=" << m << " N=" << n << " K=" << k
                    << " at " << i << "," << j << ": " << got << " vs " << want;
              }
            // Each row alone equals its row in the batch.
            for (int64_t i = 0; i < m; ++i) {
              std::vector<float> one(static_cast<size_t>(n), NAN);
              linear(x.data() + i * k, 1, WeightView{wq.data(), dt, n, k}, nullptr, one.data());
              ASSERT_EQ(std::memcmp(one.data(), y.data() + i * n, static_cast<size_t>(n) * 4), 0)
                  << dtype_name(dt) << " row " << i << " of " << m;
            }
          }
        }
      }
    }
  }
}

// The largest integer sums the q8 kernels form: every Q4_K / Q5_K quant at its maximum (15, 31)
// against activations of +127 or -127 (the int16 partial sums of the interleaved and tiled x86
// paths are at their bounds, 30480 and 31496), for every row count (tile, interleaved).
TEST(LinearBlocks, Q8ActivationsLargestKQuantSums) {
  ScopedActivations mode(Activations::kQ8);
  const int64_t k = 512, n = 16;
  for (DType dt : {DType::kQ4_K, DType::kQ5_K}) {
    const int64_t bb = block_bytes(dt);
    std::vector<uint8_t> w(static_cast<size_t>(n * (k / 256) * bb));
    for (int64_t b = 0; b < n * (k / 256); ++b) {
      uint8_t* blk = w.data() + b * bb;
      const uint16_t d = 0x3800, dmin = 0x2c00;  // 0.5, 0.0625
      std::memcpy(blk, &d, 2);
      std::memcpy(blk + 2, &dmin, 2);
      for (int i = 0; i < 12; ++i) blk[4 + i] = static_cast<uint8_t>(0x3f ^ (b + i) % 5);  // scales, mins near 63
      std::memset(blk + 16, 0xff, static_cast<size_t>(bb - 16));                       // quants 15 / 31
    }
    std::vector<float> wd(static_cast<size_t>(n * k));
    convert_to_f32(dt, w.data(), wd.data(), wd.size());
    for (int64_t m : {1, 4, 9, 70}) {
      std::vector<float> x(static_cast<size_t>(m * k));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t e = 0; e < k; ++e) x[static_cast<size_t>(i * k + e)] = (e / 256 + i) % 2 ? -127.0f : 127.0f;
      std::vector<float> y(static_cast<size_t>(m * n), NAN);
      linear(x.data(), m, WeightView{w.data(), dt, n, k}, nullptr, y.data());
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double want = 0, mag = 0;
          for (int64_t e = 0; e < k; ++e) {
            want += static_cast<double>(x[static_cast<size_t>(i * k + e)]) * wd[static_cast<size_t>(j * k + e)];
            mag += std::fabs(static_cast<double>(x[static_cast<size_t>(i * k + e)]) * wd[static_cast<size_t>(j * k + e)]);
          }
          ASSERT_NEAR(y[static_cast<size_t>(i * n + j)], want, 4e-6 * mag)
              << dtype_name(dt) << " M=" << m << " at " << i << "," << j;
        }
    }
  }
}

// Quantized weights times f32 activations differ from q8: the mode switch reaches the kernels.
TEST(LinearBlocks, ActivationsModeChangesQuantizedOnly) {
  std::mt19937 rng(12);
  const int64_t n = 16, k = 256;
  const auto x = random_vec(static_cast<size_t>(k), rng), wf = random_vec(static_cast<size_t>(n * k), rng);
  std::vector<uint8_t> wq(dtype_bytes(DType::kQ8_0, n * k));
  convert_from_f32(wf.data(), DType::kQ8_0, wq.data(), wf.size());
  std::vector<float> f32_mode(n), q8_mode(n), f32w_f32(n), f32w_q8(n);
  ScopedActivations f32(Activations::kF32);
  linear(x.data(), 1, WeightView{wq.data(), DType::kQ8_0, n, k}, nullptr, f32_mode.data());
  linear(x.data(), 1, WeightView{wf.data(), DType::kF32, n, k}, nullptr, f32w_f32.data());
  {
    ScopedActivations mode(Activations::kQ8);
    linear(x.data(), 1, WeightView{wq.data(), DType::kQ8_0, n, k}, nullptr, q8_mode.data());
    linear(x.data(), 1, WeightView{wf.data(), DType::kF32, n, k}, nullptr, f32w_q8.data());
  }
  EXPECT_NE(std::memcmp(f32_mode.data(), q8_mode.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(f32w_f32.data(), f32w_q8.data(), n * 4), 0);
  EXPECT_EQ(parse_activations("q8"), Activations::kQ8);
  EXPECT_THROW(parse_activations("int8"), Error);
}

TEST(LinearBlocks, Q8_0QuantizesAsLlamaCppReference) {
  // d = max|x| / 127 stored as f16, q = roundf(x / d) (halves away from zero), all-zero blocks.
  float x[64] = {};
  for (int i = 0; i < 32; ++i) x[i] = (i - 16) * 0.25f;  // max |x| = 4: d = 4/127
  uint8_t b[68];
  convert_from_f32(x, DType::kQ8_0, b, 64);
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  EXPECT_EQ(dh, f32_to_f16(4.0f / 127.0f));
  EXPECT_EQ(static_cast<int8_t>(b[2]), -127);
  EXPECT_EQ(static_cast<int8_t>(b[2 + 16]), 0);
  EXPECT_EQ(static_cast<int8_t>(b[2 + 20]), 32);   // 1.0 * 127 / 4 = 31.75
  EXPECT_EQ(static_cast<int8_t>(b[2 + 31]), 119);  // 3.75 * 127 / 4 = 119.06
  std::memcpy(&dh, b + 34, 2);
  EXPECT_EQ(dh, 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(b[36 + i], 0);
  float back[64];
  convert_to_f32(DType::kQ8_0, b, back, 64);
  EXPECT_EQ(back[0], -127.0f * f16_to_f32(f32_to_f16(4.0f / 127.0f)));
  EXPECT_THROW(convert_from_f32(x, DType::kQ8_0, b, 40), Error);
}

TEST(LinearBlocks, Q4_0QuantizesAsLlamaCppReference) {
  // m = the value of largest magnitude (-4 here), d = m / -8 = 0.5 as f16, q = min(15, int(x / d + 8.5)).
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = (i - 16) * 0.25f;
  uint8_t b[18];
  convert_from_f32(x, DType::kQ4_0, b, 32);
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  EXPECT_EQ(dh, f32_to_f16(0.5f));
  // x[0] = -4: -4 / 0.5 = -8 -> q 0 (nibble 0 of byte 0); x[16] = 0 -> q 8 (nibble 1 of byte 0);
  // x[31] = 3.75 -> 7.5 + 8.5 = 16 -> clamped to 15; x[1] = -3.75 -> -7.5 + 8.5 = 1.
  EXPECT_EQ(b[2], 0x80);
  EXPECT_EQ(b[3], 0x91);  // x[1] -> 1, x[17] = 0.25 -> 0.5 + 8.5 = 9
  EXPECT_EQ(b[2 + 15] >> 4, 15);
  float back[32];
  convert_to_f32(DType::kQ4_0, b, back, 32);
  EXPECT_EQ(back[0], -4.0f);
  EXPECT_EQ(back[31], 3.5f);
}

// The first 16 bytes of a Q4_K or Q5_K block, built by hand: f16 d = 0.5, dmin = 0.25; 6-bit
// scales and mins kHandSc and kHandM packed as llama.cpp's block_q4_K / block_q5_K hold them.
const int kHandSc[8] = {1, 2, 3, 4, 37, 6, 7, 63}, kHandM[8] = {5, 0, 9, 10, 11, 12, 50, 33};
void write_hand_k_header(uint8_t* b) {
  const uint16_t d = 0x3800, dmin = 0x3400;  // 0.5, 0.25
  std::memcpy(b, &d, 2);
  std::memcpy(b + 2, &dmin, 2);
  // Bytes 0-3: sc[0..3] | (sc[4..7] >> 4) << 6; bytes 4-7: m[0..3] | (m[4..7] >> 4) << 6;
  // bytes 8-11: (sc[4..7] & 15) | (m[4..7] & 15) << 4.
  // sc[4] = 37 = 0b10'0101, sc[7] = 63 = 0b11'1111, m[6] = 50 = 0b11'0010, m[7] = 33 = 0b10'0001.
  const uint8_t scales[12] = {1 | (2 << 6), 2, 3, 4 | (3 << 6), 5, 0, 9 | (3 << 6), 10 | (2 << 6),
                              5 | (11 << 4), 6 | (12 << 4), 7 | (2 << 4), 15 | (1 << 4)};
  std::memcpy(b + 4, scales, 12);
}

// The kernel's widening (decode path, W read in place) of the one-row block b of type dt equals
// its dequantization y: x = unit vector e.
void expect_widening_is(const uint8_t* b, DType dt, const float* y) {
  ScopedActivations f32(Activations::kF32);
  for (int e = 0; e < 256; ++e) {
    float x[256] = {}, out = NAN;
    x[e] = 1.0f;
    linear(x, 1, WeightView{b, dt, 1, 256}, nullptr, &out);
    ASSERT_EQ(out, y[e]) << dtype_name(dt) << " linear, element " << e;
  }
}

// The Q4_K layout, on a block built by hand (write_hand_k_header); quant byte b of each 32-byte
// chunk c is (b % 16) | ((15 - b % 16) << 4).
TEST(LinearBlocks, Q4_KLayout) {
  uint8_t b[144] = {};
  write_hand_k_header(b);
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  float y[256];
  convert_to_f32(DType::kQ4_K, b, y, 256);
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32, i = e % 32;  // sub-block 2c: low nibbles of chunk c; 2c + 1: high
    const int q = sub % 2 == 0 ? i % 16 : 15 - i % 16;
    const float want = 0.5f * static_cast<float>(kHandSc[sub]) * static_cast<float>(q) -
                       0.25f * static_cast<float>(kHandM[sub]);
    ASSERT_EQ(y[e], want) << "element " << e;
  }
  expect_widening_is(b, DType::kQ4_K, y);
  EXPECT_EQ(y[0], -1.25f);             // q 0, sub-block 0: -0.25 * 5
  EXPECT_EQ(y[32 * 4 + 1], 18.5f - 2.75f);  // sub-block 4 (high bits of sc in byte 0): 0.5 * 37 * 1 - 0.25 * 11
  EXPECT_EQ(y[224], 464.25f);           // sub-block 7 (sc 63, m 33), high nibble 15 of chunk 3's byte 0
  EXPECT_EQ(y[255], -8.25f);            // and 0 of its byte 31
}

// The Q5_K layout, on a block built from chosen 5-bit quants q[e] by the layout rules of
// llama.cpp's block_q5_K: Q4_K's d, dmin and scale bytes (write_hand_k_header), then qh[32],
// then qs[128]. Elements 64c + i and 64c + 32 + i (c < 4, i < 32) take the low and high nibble of
// qs byte 32c + i and bits 2c and 2c + 1 of qh byte i as their fifth bits.
TEST(LinearBlocks, Q5_KLayout) {
  uint8_t b[176] = {};
  write_hand_k_header(b);
  int q[256];
  for (int e = 0; e < 256; ++e) q[e] = (e * 13 + 5) % 32;
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 32; ++i) {
      const int lo = q[64 * c + i], hi = q[64 * c + 32 + i];
      b[48 + 32 * c + i] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
      b[16 + i] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  float y[256];
  convert_to_f32(DType::kQ5_K, b, y, 256);
  for (int e = 0; e < 256; ++e) {
    ASSERT_EQ(q5_k_quant(b, e), q[e]) << "element " << e;
    const float want = 0.5f * static_cast<float>(kHandSc[e / 32]) * static_cast<float>(q[e]) -
                       0.25f * static_cast<float>(kHandM[e / 32]);
    ASSERT_EQ(y[e], want) << "element " << e;
  }
  EXPECT_EQ(y[224 + 31], 0.5f * 63 * q[255] - 0.25f * 33);
  // Element 64 * 3 + 32 + 7 = 231: the high nibble of qs byte 48 + 96 + 7 and bit 7 of qh byte 7.
  b[48 + 96 + 7] = 0xA0;
  b[16 + 7] = 0x80;
  convert_to_f32(DType::kQ5_K, b, y, 256);
  EXPECT_EQ(y[231], 0.5f * 63 * 26 - 0.25f * 33);  // q = 10 | 16
  EXPECT_EQ(y[199], 0.5f * 7 * 0 - 0.25f * 50);    // element 192 + 7: low nibble 0, bit 6 clear
  expect_widening_is(b, DType::kQ5_K, y);
}

// Properties of the Q5_K quantizer (its bytes are checked against llama.cpp's own
// quantize_row_q5_K_ref by tests/model/quantize_oracle.py): zeros give zero bytes; constants are
// reproduced to f16 precision; random data round-trips within its sub-block's range / 31 plus
// the 6-bit scale error, closer than Q4_K on the same data.
TEST(LinearBlocks, Q5_KQuantizer) {
  float x[512] = {};
  uint8_t b[352];
  std::memset(b, 0xee, sizeof b);
  convert_from_f32(x, DType::kQ5_K, b, 256);
  for (int i = 0; i < 176; ++i) ASSERT_EQ(b[i], 0) << i;
  for (int i = 0; i < 256; ++i) x[i] = i < 128 ? 3.0f : -2.0f;
  convert_from_f32(x, DType::kQ5_K, b, 256);
  float y[512], y4[512];
  convert_to_f32(DType::kQ5_K, b, y, 256);
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(y[i], x[i], 2e-3f * std::fabs(x[i])) << i;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  convert_from_f32(x, DType::kQ5_K, b, 512);
  convert_to_f32(DType::kQ5_K, b, y, 512);
  uint8_t b4[288];
  convert_from_f32(x, DType::kQ4_K, b4, 512);
  convert_to_f32(DType::kQ4_K, b4, y4, 512);
  double err5 = 0, err4 = 0;
  for (int j = 0; j < 16; ++j) {
    float lo = 0, hi = 0;
    for (int i = 0; i < 32; ++i) lo = std::min(lo, x[32 * j + i]), hi = std::max(hi, x[32 * j + i]);
    for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(y[32 * j + i] - x[32 * j + i]), (hi - lo) / 31 * 1.5f) << 32 * j + i;
  }
  for (int i = 0; i < 512; ++i) {
    err5 += (y[i] - x[i]) * (y[i] - x[i]);
    err4 += (y4[i] - x[i]) * (y4[i] - x[i]);
  }
  EXPECT_LT(err5, err4 / 3);  // one more bit: about a quarter of the squared error
  EXPECT_THROW(convert_from_f32(x, DType::kQ5_K, b, 128), Error);
}

// Properties of the Q4_K quantizer (its bytes are checked against llama.cpp's own
// quantize_row_q4_K_ref by tests/model/quantize_oracle.py): zeros give zero bytes; a constant
// sub-block is reproduced to f16 precision; random data round-trips within a 4-bit step.
TEST(LinearBlocks, Q4_KQuantizer) {
  float x[512] = {};
  uint8_t b[288];
  convert_from_f32(x, DType::kQ4_K, b, 256);
  for (int i = 0; i < 144; ++i) ASSERT_EQ(b[i], 0) << i;
  for (int i = 0; i < 256; ++i) x[i] = i < 128 ? 3.0f : -2.0f;  // positive and negative constants
  convert_from_f32(x, DType::kQ4_K, b, 256);
  float y[512];
  convert_to_f32(DType::kQ4_K, b, y, 256);
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(y[i], x[i], 2e-3f * std::fabs(x[i])) << i;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  convert_from_f32(x, DType::kQ4_K, b, 512);
  convert_to_f32(DType::kQ4_K, b, y, 512);
  for (int j = 0; j < 16; ++j) {  // each sub-block within its range / 15, plus the 6-bit scale error
    float lo = 0, hi = 0;
    for (int i = 0; i < 32; ++i) lo = std::min(lo, x[32 * j + i]), hi = std::max(hi, x[32 * j + i]);
    for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(y[32 * j + i] - x[32 * j + i]), (hi - lo) / 15) << 32 * j + i;
  }
  EXPECT_THROW(convert_from_f32(x, DType::kQ4_K, b, 128), Error);
}

// The Q6_K layout, on a block built from chosen 6-bit quants q[e] (e < 256) by the layout rules
// of llama.cpp's block_q6_K: half c (128 elements) in ql[64c..64c+64) and qh[32c..32c+32);
// elements i, 32 + i, 64 + i, 96 + i of a half take the low nibble of ql byte i, the low nibble
// of byte 32 + i, the high nibble of byte i, the high nibble of byte 32 + i, and bits 0-1, 2-3,
// 4-5, 6-7 of qh byte i. f16 d = 0.5 last, int8 scales per 16 (with -128 and 127).
TEST(LinearBlocks, Q6_KLayout) {
  uint8_t b[210] = {};
  int q[256];
  for (int e = 0; e < 256; ++e) q[e] = (e * 37 + 11) % 64;
  for (int c = 0; c < 2; ++c) {
    for (int i = 0; i < 32; ++i) {
      const int* h = q + 128 * c;
      b[64 * c + i] = static_cast<uint8_t>((h[i] & 15) | ((h[64 + i] & 15) << 4));
      b[64 * c + 32 + i] = static_cast<uint8_t>((h[32 + i] & 15) | ((h[96 + i] & 15) << 4));
      b[128 + 32 * c + i] = static_cast<uint8_t>((h[i] >> 4) | ((h[32 + i] >> 4) << 2) | ((h[64 + i] >> 4) << 4) |
                                                 ((h[96 + i] >> 4) << 6));
    }
  }
  const int8_t sc[16] = {1, -2, 3, 4, -128, 6, 7, 127, -9, 10, 11, 12, -3, 14, 0, 16};
  std::memcpy(b + 192, sc, 16);
  const uint16_t d = 0x3800;  // 0.5
  std::memcpy(b + 208, &d, 2);
  float y[256];
  convert_to_f32(DType::kQ6_K, b, y, 256);
  for (int e = 0; e < 256; ++e) {
    ASSERT_EQ(q6_k_quant(b, e), q[e]) << "element " << e;
    ASSERT_EQ(y[e], 0.5f * static_cast<float>(sc[e / 16]) * static_cast<float>(q[e] - 32)) << "element " << e;
  }
  // Element 200: half 1, 72 = 64 + 8: the high nibble of ql byte 64 + 8 and bits 4-5 of qh byte 128 + 32 + 8.
  b[72] = 0xA5;
  b[168] = 0x20;
  convert_to_f32(DType::kQ6_K, b, y, 256);
  EXPECT_EQ(y[200], -15.0f);  // q = 10 | 2 << 4 = 42; 0.5 * -3 * (42 - 32)
  EXPECT_EQ(y[136], 121.5f);  // element 128 + 8: low nibble 5 of byte 72, bits 0-1 (0) of 168; 0.5 * -9 * (5 - 32)
  // (d * scale) * (q - 32) is exact in f32: at most 11 + 7 + 5 significant bits (2047 * 127 * 31 < 2^24).
  const uint16_t d2 = 0x3bff;  // 0.99951171875
  std::memcpy(b + 208, &d2, 2);
  b[192 + 7] = 127;
  std::memset(b, 0xff, 64);        // half 0: every quant 63
  std::memset(b + 128, 0xff, 32);
  convert_to_f32(DType::kQ6_K, b, y, 256);
  const double d2f = f16_to_f32(d2);
  EXPECT_EQ(static_cast<double>(y[112]), d2f * 127 * 31);  // sub-block 7
  EXPECT_EQ(static_cast<double>(y[0]), d2f * 1 * 31);
}

// Properties of the Q6_K quantizer (its bytes are checked against llama.cpp's own
// quantize_row_q6_K_ref by tests/model/quantize_oracle.py): zeros give zero bytes; random data
// round-trips within two steps of its sub-block's scale; widths not whole super-blocks throw.
TEST(LinearBlocks, Q6_KQuantizer) {
  float x[512] = {};
  uint8_t b[420];
  std::memset(b, 0xee, sizeof b);
  convert_from_f32(x, DType::kQ6_K, b, 256);
  for (int i = 0; i < 210; ++i) ASSERT_EQ(b[i], 0) << i;
  for (int i = 0; i < 256; ++i) x[i] = i < 128 ? 3.0f : -2.0f;  // positive and negative constants
  convert_from_f32(x, DType::kQ6_K, b, 256);
  float y[512];
  convert_to_f32(DType::kQ6_K, b, y, 256);
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(y[i], x[i], 2e-2f * std::fabs(x[i])) << i;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  convert_from_f32(x, DType::kQ6_K, b, 512);
  convert_to_f32(DType::kQ6_K, b, y, 512);
  for (int blk = 0; blk < 2; ++blk) {
    uint16_t dh;
    std::memcpy(&dh, b + 210 * blk + 208, 2);
    for (int j = 0; j < 16; ++j) {
      const float step = std::fabs(f16_to_f32(dh) * static_cast<float>(static_cast<int8_t>(b[210 * blk + 192 + j])));
      ASSERT_GT(step, 0.0f);
      for (int i = 0; i < 16; ++i) {
        const int e = 256 * blk + 16 * j + i;
        EXPECT_LE(std::fabs(y[e] - x[e]), 2 * step) << e;
      }
    }
  }
  EXPECT_THROW(convert_from_f32(x, DType::kQ6_K, b, 128), Error);
}

TEST(LinearBlocks, RejectsRowsOfPartialBlocks) {
  std::vector<uint8_t> w(210 * 4);
  float x[512] = {}, y[2];
  EXPECT_THROW(linear(x, 1, WeightView{w.data(), DType::kQ8_0, 2, 48}, nullptr, y), Error);
  EXPECT_THROW(linear(x, 1, WeightView{w.data(), DType::kQ4_0, 2, 48}, nullptr, y), Error);
  EXPECT_THROW(linear(x, 1, WeightView{w.data(), DType::kQ4_K, 2, 288}, nullptr, y), Error);
  EXPECT_THROW(linear(x, 1, WeightView{w.data(), DType::kQ5_K, 2, 288}, nullptr, y), Error);
  EXPECT_THROW(linear(x, 1, WeightView{w.data(), DType::kQ6_K, 2, 288}, nullptr, y), Error);
}

TEST(Linear, ZeroKGivesBias) {
  const float bias[3] = {1.0f, -2.0f, 3.5f};
  float y[6];
  linear(nullptr, 2, WeightView{nullptr, DType::kF32, 3, 0}, bias, y);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], bias[i % 3]);
}

TEST(Linear, RejectsUnsupportedDtype) {
  int32_t w[4] = {};
  float x[2] = {1, 2}, y[2];
  EXPECT_THROW(linear(x, 1, WeightView{w, DType::kI32, 2, 2}, nullptr, y), Error);
}

}  // namespace
}  // namespace astrai::kernels
