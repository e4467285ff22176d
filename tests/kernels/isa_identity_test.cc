// Every kernel on every CPU level this machine runs gives the same bytes as the generic
// (portable C++) level: the levels differ in speed, never in results. Each test runs once per
// level compiled into the binary besides generic, and is skipped, saying why, on a CPU that
// cannot run that level. The generic level itself is checked against double-precision
// references by the other kernel tests (run under ASTRAI_CPU_ISA=generic by CTest too).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_mode.h"
#include "tensor/dtype.h"

namespace astrai::kernels {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  // A few exact zeros of both signs: the padded lanes and the tree must treat them alike.
  for (size_t i = 0; i < n; i += 97) v[i] = (i / 97) % 2 ? -0.0f : 0.0f;
  return v;
}

std::vector<uint16_t> to_bits(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = t == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return out;
}

template <typename T>
::testing::AssertionResult same_bytes(const std::vector<T>& want, const std::vector<T>& got) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << "sizes " << want.size() << " vs " << got.size();
  if (std::memcmp(want.data(), got.data(), want.size() * sizeof(T)) == 0) return ::testing::AssertionSuccess();
  size_t diffs = 0, first = want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0) {
      ++diffs;
      first = std::min(first, i);
    }
  }
  return ::testing::AssertionFailure() << diffs << " of " << want.size() << " values differ, first at " << first
                                       << ": generic " << want[first] << ", this level " << got[first];
}

// Sets the activations mode of quantized weights for a scope (the default is q8).
struct ScopedActivations {
  explicit ScopedActivations(Activations a) : saved(activations()) { set_activations(a); }
  ~ScopedActivations() { set_activations(saved); }
  Activations saved;
};

// Allows or forbids the VNNI kernels for a scope.
struct ScopedVnni {
  explicit ScopedVnni(bool on) : saved(vnni_allowed()) { set_vnni(on); }
  ~ScopedVnni() { set_vnni(saved); }
  bool saved;
};

struct ThreadCount {
  explicit ThreadCount(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved); }
  int saved;
};

class IsaIdentity : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU (" << (cpu_info().model.empty() ? cpu_info().arch : cpu_info().model)
                   << ") cannot run level " << isa_name(GetParam());
    ref_ = &kernel_table(Isa::kGeneric);
    lvl_ = &kernel_table(GetParam());
  }
  // Runs fn(table) on generic and on the level under test; fn returns its outputs.
  template <typename Fn>
  void expect_same(Fn&& fn, const std::string& what) {
    for (int threads : {1, 2}) {
      ThreadCount tc(threads);
      const auto want = fn(*ref_);
      const auto got = fn(*lvl_);
      EXPECT_TRUE(same_bytes(want, got)) << what << ", " << threads << " thread(s)";
    }
  }
  // Q4_K / Q5_K / Q6_K linear on every path of this level (defined below).
  void expect_k_quant_paths(DType dt);
  // linear on this level equals generic, with and without the bias.
  void expect_linear_same(const std::vector<float>& x, int64_t m, const WeightView& w, const std::vector<float>& bias) {
    for (bool with_bias : {false, true}) {
      expect_same(
          [&](const KernelTable& t) {
            std::vector<float> y(static_cast<size_t>(m * w.rows), NAN);
            t.linear(x.data(), m, w, with_bias ? bias.data() : nullptr, y.data());
            return y;
          },
          "linear " + std::string(dtype_name(w.dtype)) + " " + std::to_string(m) + "x" + std::to_string(w.rows) + "x" +
              std::to_string(w.cols) + (with_bias ? " +bias" : ""));
    }
  }
  const KernelTable* ref_ = nullptr;
  const KernelTable* lvl_ = nullptr;
};

std::vector<Isa> levels_besides_generic() {
  std::vector<Isa> out;
  for (Isa isa : compiled_isas())
    if (isa != Isa::kGeneric) out.push_back(isa);
  return out;
}

// ---- linear: every path (in place, L1-packed, packed; full and partial groups; K tails) ----

struct LinearShape {
  int64_t m, n, k;
};

TEST_P(IsaIdentity, LinearEveryDtypeAndPath) {
  const std::vector<LinearShape> shapes = {
      {1, 7, 5},      {1, 40, 2500},  {2, 13, 16},  {3, 96, 17},   {4, 50, 1024}, {5, 31, 1025},
      {8, 24, 300},   {9, 23, 100},   {16, 61, 48}, {33, 70, 129}, {64, 18, 200}, {65, 30, 150},
      {200, 140, 40}, {7, 130, 3000}, {1, 1, 1},    {3, 2, 33},    {150, 21, 2100},
      {1, 45, 1100},  // decode by rows (gemv_rows): two threads' shares of 24 and 21 (odd) rows
  };
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const LinearShape& s : shapes) {
      const auto x = randn(static_cast<size_t>(s.m * s.k), 1);
      const auto wf = randn(static_cast<size_t>(s.n * s.k), 2, 0.2f);
      const auto bias = randn(static_cast<size_t>(s.n), 3);
      const std::vector<uint16_t> wh = dt == DType::kF32 ? std::vector<uint16_t>() : to_bits(wf, dt);
      const WeightView w{dt == DType::kF32 ? static_cast<const void*>(wf.data()) : wh.data(), dt, s.n, s.k};
      expect_linear_same(x, s.m, w, bias);
    }
  }
}

// Q8_0 and Q4_0 weights (rows of whole blocks of 32): the quantized paths of every level equal generic.
TEST_P(IsaIdentity, LinearQ8_0AndQ4_0EveryPath) {
  ScopedActivations mode(Activations::kF32);
  const std::vector<LinearShape> shapes = {
      {1, 7, 32},   {1, 40, 2496}, {2, 13, 64},   {3, 96, 96},   {4, 50, 1024}, {5, 31, 1056},
      {8, 24, 320}, {9, 23, 96},   {16, 61, 64},  {33, 70, 160}, {64, 18, 224}, {65, 30, 160},
      {200, 140, 64}, {7, 130, 3008}, {150, 21, 2112},
  };
  for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
    for (const LinearShape& s : shapes) {
      const auto x = randn(static_cast<size_t>(s.m * s.k), 1);
      const auto wf = randn(static_cast<size_t>(s.n * s.k), 2, 0.2f);
      const auto bias = randn(static_cast<size_t>(s.n), 3);
      std::vector<uint8_t> wq(dtype_bytes(dt, s.n * s.k));
      convert_from_f32(wf.data(), dt, wq.data(), wf.size());
      expect_linear_same(x, s.m, WeightView{wq.data(), dt, s.n, s.k}, bias);
    }
  }
}

// Q4_K, Q5_K and Q6_K weights (super-blocks of 256): every path of every level equals generic, and
// equals that level's f32 linear on the dequantized weights (the widening is the
// dequantization, bit for bit).
void IsaIdentity::expect_k_quant_paths(DType dt) {
  ScopedActivations mode(Activations::kF32);
  const std::vector<LinearShape> shapes = {
      {1, 7, 256},   {1, 40, 2560}, {2, 13, 512},  {3, 96, 256},  {4, 50, 1024}, {5, 31, 1280},
      {8, 24, 768},  {9, 23, 256},  {16, 61, 256}, {33, 70, 512}, {64, 18, 256}, {65, 30, 512},
      {200, 140, 256}, {7, 130, 3072}, {150, 21, 2304},
  };
  for (const LinearShape& s : shapes) {
    const auto x = randn(static_cast<size_t>(s.m * s.k), 1);
    const auto wf = randn(static_cast<size_t>(s.n * s.k), 2, 0.2f);
    const auto bias = randn(static_cast<size_t>(s.n), 3);
    std::vector<uint8_t> wq(dtype_bytes(dt, s.n * s.k));
    convert_from_f32(wf.data(), dt, wq.data(), wf.size());
    const WeightView w{wq.data(), dt, s.n, s.k};
    expect_linear_same(x, s.m, w, bias);
    std::vector<float> wd(wf.size());
    convert_to_f32(dt, wq.data(), wd.data(), wd.size());
    std::vector<float> yq(static_cast<size_t>(s.m * s.n), NAN), yf(yq.size(), NAN);
    lvl_->linear(x.data(), s.m, w, bias.data(), yq.data());
    lvl_->linear(x.data(), s.m, WeightView{wd.data(), DType::kF32, s.n, s.k}, bias.data(), yf.data());
    ASSERT_EQ(std::memcmp(yq.data(), yf.data(), yq.size() * 4), 0)
        << dtype_name(dt) << " vs f32 on the dequantized weights, " << s.m << "x" << s.n << "x" << s.k;
  }
}

TEST_P(IsaIdentity, LinearQ4_KEveryPath) { expect_k_quant_paths(DType::kQ4_K); }

// linear_group (q, k, v or gate, up of one x) gives each matrix the bytes of its own linear() on
// this level and on generic: one job for quantized matrices with the same activation blocks
// (mixed types, partial groups of 8 rows, a matrix boundary inside a thread's share of 1-3
// threads, rows past one row block), one by one otherwise (mixed block sizes, float weights).
TEST_P(IsaIdentity, LinearGroupEqualsItsLinears) {
  ScopedActivations mode(Activations::kQ8);
  struct Spec {
    DType dtype;
    int64_t rows;
  };
  const std::vector<std::pair<int64_t, std::vector<Spec>>> groups = {
      {768, {{DType::kQ4_K, 40}, {DType::kQ4_K, 17}, {DType::kQ6_K, 24}}},
      {512, {{DType::kQ4_0, 24}, {DType::kQ8_0, 9}, {DType::kQ4_0, 16}}},
      {256, {{DType::kQ5_K, 8}, {DType::kQ4_K, 8}}},
      {512, {{DType::kQ4_K, 16}, {DType::kQ4_0, 8}}},  // 256 and 32 activation blocks: one by one
      {256, {{DType::kF32, 12}, {DType::kBF16, 9}}},
  };
  for (const auto& [k, specs] : groups) {
    std::vector<std::vector<uint8_t>> weights;
    std::vector<std::vector<float>> biases;
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto wf = randn(static_cast<size_t>(specs[i].rows * k), 20 + static_cast<uint32_t>(i), 0.2f);
      weights.emplace_back(dtype_bytes(specs[i].dtype, specs[i].rows * k));
      convert_from_f32(wf.data(), specs[i].dtype, weights.back().data(), wf.size());
      biases.push_back(randn(static_cast<size_t>(specs[i].rows), 30 + static_cast<uint32_t>(i)));
    }
    for (int64_t m : {1, 3, 9, 65, 130}) {
      const auto x = randn(static_cast<size_t>(m * k), 7);
      // Every matrix's outputs, end to end: by the group (grouped) or by one linear() each.
      const auto run = [&](const KernelTable& t, bool grouped) {
        std::vector<std::vector<float>> ys;
        std::vector<LinearOut> outs;
        for (size_t i = 0; i < specs.size(); ++i) {
          ys.emplace_back(static_cast<size_t>(m * specs[i].rows), NAN);
          outs.push_back({WeightView{weights[i].data(), specs[i].dtype, specs[i].rows, k},
                          i % 2 ? nullptr : biases[i].data(), ys.back().data()});
        }
        if (grouped) t.linear_group(x.data(), m, outs.data(), static_cast<int64_t>(outs.size()));
        else
          for (const LinearOut& o : outs) t.linear(x.data(), m, o.w, o.bias, o.y);
        std::vector<float> all;
        for (const auto& y : ys) all.insert(all.end(), y.begin(), y.end());
        return all;
      };
      const std::string what = "group of " + std::to_string(specs.size()) + ", K " + std::to_string(k) + ", " +
                               std::to_string(m) + " rows";
      for (int threads : {1, 2, 3}) {
        ThreadCount tc(threads);
        const auto want = run(*ref_, false);
        EXPECT_TRUE(same_bytes(want, run(*ref_, true))) << what << " (generic), " << threads << " thread(s)";
        EXPECT_TRUE(same_bytes(want, run(*lvl_, true))) << what << ", " << threads << " thread(s)";
        EXPECT_TRUE(same_bytes(want, run(*lvl_, false))) << what << " one by one, " << threads << " thread(s)";
      }
    }
  }
}

TEST_P(IsaIdentity, LinearQ5_KEveryPath) { expect_k_quant_paths(DType::kQ5_K); }
TEST_P(IsaIdentity, LinearQ6_KEveryPath) { expect_k_quant_paths(DType::kQ6_K); }

// The q8 activation mode (integer block dot products, kernels/cpu/linear_int8.h): every level
// and every tile equals generic, for each quantized format, including blocks of zeros, a block
// holding an infinity and rows of tiny values.
TEST_P(IsaIdentity, LinearQ8ActivationsEveryFormat) {
  ScopedActivations mode(Activations::kQ8);
  const std::vector<LinearShape> shapes = {
      {1, 8, 256},  {1, 40, 2560}, {2, 13, 512}, {3, 96, 256},   {4, 50, 1024},
      {5, 31, 768}, {8, 24, 768},  {9, 23, 256}, {65, 30, 512},  {7, 130, 3072},
  };
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (const LinearShape& s : shapes) {
      auto x = randn(static_cast<size_t>(s.m * s.k), 1);
      for (int64_t e = 0; e < 32; ++e) x[static_cast<size_t>(e)] = 0.0f;        // a zero block
      if (s.m > 1) x[static_cast<size_t>(s.k + 3)] = INFINITY;                   // row 1: d = NaN
      if (s.m > 2)
        for (int64_t e = 0; e < s.k; ++e) x[static_cast<size_t>(2 * s.k + e)] *= 1e-32f;  // row 2: below 1e-30
      const auto wf = randn(static_cast<size_t>(s.n * s.k), 2, 0.2f);
      const auto bias = randn(static_cast<size_t>(s.n), 3);
      std::vector<uint8_t> wq(dtype_bytes(dt, s.n * s.k));
      convert_from_f32(wf.data(), dt, wq.data(), wf.size());
      expect_linear_same(x, s.m, WeightView{wq.data(), dt, s.n, s.k}, bias);
    }
  }
}

// VNNI (vpdpbusd) in the integer kernels, where the level and this CPU have it: with it on and
// off, each level equals generic on the routes it changes (every format's interleaved steps:
// partial row tiles, partial groups, several row blocks; v4's few-row tiles reading Q4_0, Q4_K
// and Q5_K in place: 1 to 4 rows, Q4_0 with an odd number of blocks), with raw Q8_0 blocks over
// the whole int8 range (-128 included) against activations that quantize to +-127.
TEST_P(IsaIdentity, LinearQ8ActivationsWithAndWithoutVnni) {
  // VNNI's vpdpbusd on v3 and v4, sdot on neon (qemu-user's default CPU has it).
  const char* feature = vnni_feature(GetParam());
  if (!feature) GTEST_SKIP() << "level " << isa_name(GetParam()) << " has no dot-product kernels";
  if (!cpu_has(feature)) GTEST_SKIP() << "this CPU has no " << feature << " (those kernels cannot run here)";
  ScopedActivations mode(Activations::kQ8);
  // v4 takes up to three whole groups of 8 W rows at once by tiles of 4 rows (groups_at_once):
  // rows of x past a row block and 1-3 left over, odd and partial groups after the multi-group
  // units.
  const std::vector<LinearShape> q32_shapes = {{1, 8, 32},    {2, 16, 96},   {3, 24, 160},   {4, 13, 288},
                                               {1, 19, 512},  {5, 8, 32},    {6, 16, 64},    {7, 13, 96},
                                               {13, 40, 256}, {64, 24, 512}, {65, 30, 160},  {130, 17, 1024},
                                               {7, 32, 96},   {11, 52, 64}};
  const std::vector<LinearShape> k_shapes = {{1, 16, 256},  {2, 9, 512},   {3, 24, 768},  {4, 17, 1024},
                                             {9, 16, 256},  {13, 40, 512}, {33, 24, 768}, {65, 17, 1024},
                                             {130, 9, 256}, {6, 32, 512},  {7, 48, 256},  {11, 20, 768}};
  for (bool on : {true, false}) {
    ScopedVnni vnni(on);
    for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
      for (const LinearShape& s : is_k_quant(dt) ? k_shapes : q32_shapes) {
        auto x = randn(static_cast<size_t>(s.m * s.k), 4);
        const int64_t loud = std::min<int64_t>(3, s.m - 1);  // a row whose activations quantize to +-127
        for (int64_t e = 0; e < s.k; ++e) x[static_cast<size_t>(loud * s.k + e)] = e % 2 ? 5.0f : -5.0f;
        const auto bias = randn(static_cast<size_t>(s.n), 5);
        std::vector<uint8_t> wq(dtype_bytes(dt, s.n * s.k));
        if (dt == DType::kQ8_0) {  // raw blocks: any byte, a small positive f16 scale
          uint32_t state = 12345;
          for (size_t i = 0; i < wq.size(); ++i) {
            state = state * 1664525u + 1013904223u;
            wq[i] = static_cast<uint8_t>(state >> 24);
          }
          for (int64_t b = 0; b < s.n * s.k / 32; ++b) {
            wq[static_cast<size_t>(b * 34)] = static_cast<uint8_t>(b % 7);
            wq[static_cast<size_t>(b * 34 + 1)] = 0x20;  // 2^-7 and a little more
          }
          for (size_t e = 2; e < 34; ++e) wq[e] = e % 2 ? 0x80 : 0x7f;  // block 0: -128 and 127
        } else {
          const auto wf = randn(static_cast<size_t>(s.n * s.k), 6, 0.2f);
          convert_from_f32(wf.data(), dt, wq.data(), wf.size());
        }
        SCOPED_TRACE(std::string("vnni ") + (on ? "on" : "off"));
        expect_linear_same(x, s.m, WeightView{wq.data(), dt, s.n, s.k}, bias);
      }
    }
  }
}

// Q4_K and Q5_K at the largest integer sums (every quant 15 or 31, scales and mins near 63,
// activations +-127 of one sign over each super-block), where the kernels sum several steps'
// products in 16-bit halves of their dwords before one scale multiply (vpdpwssd) or in int16
// (maddubs): each level equals generic on every route, with VNNI and without.
TEST_P(IsaIdentity, LinearQ8ActivationsLargestKQuantSums) {
  ScopedActivations mode(Activations::kQ8);
  const char* feature = vnni_feature(GetParam());
  const bool has_vnni = feature && cpu_has(feature);
  const std::vector<LinearShape> shapes = {{1, 16, 512}, {3, 24, 768}, {4, 17, 1024}, {9, 48, 512},
                                           {33, 24, 768}, {70, 40, 512}, {130, 9, 256}};
  for (bool vnni : {true, false}) {
    if (vnni && !has_vnni) continue;
    ScopedVnni scoped(vnni);
    for (DType dt : {DType::kQ4_K, DType::kQ5_K}) {
      for (const LinearShape& s : shapes) {
        const auto bb = static_cast<int64_t>(dtype_bytes(dt, 256));
        std::vector<uint8_t> wq(dtype_bytes(dt, s.n * s.k));
        for (int64_t b = 0; b < s.n * s.k / 256; ++b) {
          uint8_t* blk = wq.data() + b * bb;
          const uint16_t d = 0x3800, dmin = 0x2c00;  // 0.5, 0.0625
          std::memcpy(blk, &d, 2);
          std::memcpy(blk + 2, &dmin, 2);
          for (int i = 0; i < 12; ++i) blk[4 + i] = static_cast<uint8_t>(0x3f ^ (b + i) % 5);
          std::memset(blk + 16, 0xff, static_cast<size_t>(bb - 16));
        }
        std::vector<float> x(static_cast<size_t>(s.m * s.k));
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t e = 0; e < s.k; ++e) x[static_cast<size_t>(i * s.k + e)] = (e / 256 + i) % 2 ? -3.0f : 3.0f;
        const auto bias = randn(static_cast<size_t>(s.n), 5);
        SCOPED_TRACE(std::string("vnni ") + (vnni ? "on" : "off"));
        expect_linear_same(x, s.m, WeightView{wq.data(), dt, s.n, s.k}, bias);
      }
    }
  }
}

// The bf16-dot mode (kernels/cpu/linear_bf16.h): each level equals generic on every path (few
// rows and many, several row blocks, partial groups, K tails within and after a K block), with
// activations that round to bf16 denormals, products that underflow and weights that are
// denormal. On v4 with AVX512_BF16 this compares the CPU's VDPBF16PS with the definition.
TEST_P(IsaIdentity, LinearBf16DotEveryPath) {
  struct ScopedBf16Dot {
    explicit ScopedBf16Dot(bool on) : saved(bf16_dot()) { set_bf16_dot(on); }
    ~ScopedBf16Dot() { set_bf16_dot(saved); }
    bool saved;
  } on(true);
  const std::vector<LinearShape> shapes = {
      {1, 8, 32},   {1, 40, 2500}, {2, 13, 16},   {3, 96, 17},   {4, 50, 1024},  {5, 31, 1025}, {8, 24, 300},
      {9, 23, 100}, {16, 61, 48},  {65, 30, 150}, {200, 17, 40}, {7, 130, 3000}, {1, 1, 1},     {3, 2, 33},
      {197, 21, 2100},
  };
  for (const LinearShape& s : shapes) {
    auto x = randn(static_cast<size_t>(s.m * s.k), 11);
    for (size_t e = 5; e < x.size(); e += 41) x[e] *= 1e-38f;  // bf16 denormals or underflowing products
    for (int64_t e = 0; e < s.k; ++e) x[static_cast<size_t>(e)] *= 1e-21f;  // row 0 tiny
    auto wf = randn(static_cast<size_t>(s.n * s.k), 12, 0.2f);
    for (size_t e = 3; e < wf.size(); e += 53) wf[e] *= e % 2 ? 1e-30f : 1e-39f;
    // Every third output tiny: against row 0, sums of products near the smallest normal f32.
    for (int64_t j = 0; j < s.n; j += 3)
      for (int64_t e = 0; e < s.k; ++e) wf[static_cast<size_t>(j * s.k + e)] *= 1e-17f;
    const auto wh = to_bits(wf, DType::kBF16);
    const auto bias = randn(static_cast<size_t>(s.n), 13);
    expect_linear_same(x, s.m, WeightView{wh.data(), DType::kBF16, s.n, s.k}, bias);
  }
}

// v4 computes the bf16-dot mode with VDPBF16PS wherever the CPU has AVX512_BF16 (its check at
// first use passed: the instruction is what linear_bf16.h defines); every other level emulates.
TEST_P(IsaIdentity, Bf16DotUsesTheInstructionWhereTheCpuHasIt) {
  const bool expected = GetParam() == Isa::kV4 && cpu_has("avx512_bf16");
  EXPECT_EQ(lvl_->bf16_dot_native(), expected) << isa_name(GetParam());
  EXPECT_FALSE(ref_->bf16_dot_native());
}

TEST_P(IsaIdentity, LinearNonInvariantModeAndTrainingGemms) {
  const int64_t m = 40, n = 33, k = 70;
  const auto x = randn(m * k, 4), w = randn(n * k, 5), b = randn(n, 6), dy = randn(m * n, 7);
  set_batch_invariant(false);
  expect_same(
      [&](const KernelTable& t) {
        std::vector<float> y(m * n);
        t.linear(x.data(), m, WeightView{w.data(), DType::kF32, n, k}, b.data(), y.data());
        return y;
      },
      "linear, BLAS mode");
  set_batch_invariant(true);
  expect_same(
      [&](const KernelTable& t) {
        std::vector<float> y(m * n), dx(m * k, 1.0f), dw(n * k, 0.5f), db(n, 0.25f);
        t.linear(x.data(), m, WeightView{w.data(), DType::kF32, n, k}, b.data(), y.data());
        t.linear_backward_f32(dy.data(), x.data(), m, w.data(), n, k, dx.data(), true, dw.data(), db.data());
        y.insert(y.end(), dx.begin(), dx.end());
        y.insert(y.end(), dw.begin(), dw.end());
        y.insert(y.end(), db.begin(), db.end());
        return y;
      },
      "linear (f32) and its backward");
}

// ---- attention: prefill over the batch's own rows, paged decode and chunked prefill ----

struct AttnCase {
  AttentionDims d;
  int64_t len, ctx, page_size;
};

// K/V of all positions in shuffled head-major pages, as the engine's pool lays them out.
template <typename E>
void to_pages(const std::vector<E>& rows, int64_t len, int64_t heads, int64_t dim, int64_t ps,
              const std::vector<int32_t>& table, std::vector<E>& pages) {
  pages.assign(table.size() * ps * heads * dim, E{});
  for (int64_t t = 0; t < len; ++t)
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(&pages[((table[t / ps] * heads + h) * ps + t % ps) * dim], &rows[(t * heads + h) * dim], dim * sizeof(E));
}

TEST_P(IsaIdentity, AttentionPrefillPagedDecodeGqaMla) {
  const std::vector<AttnCase> cases = {
      {{4, 4, 64, 64, 0.125f}, 70, 0, 16},     // MHA prefill
      {{12, 4, 64, 64, 0.125f}, 150, 149, 16},  // GQA 3 decode, crossing 64-key chunks
      {{8, 2, 32, 80, 0.2f}, 37, 29, 5},       // GQA 4, v 80, odd page size, 8 new tokens
      {{6, 2, 24, 20, 0.2f}, 37, 20, 8},       // masked q/k and v tails
      {{4, 4, 96, 64, 0.1f}, 40, 33, 16},      // MLA shape: q/k 96 (nope + rope), v 64
      {{2, 1, 40, 160, 0.15f}, 66, 60, 8},     // v 160: dims in several chunks; MQA
      {{3, 3, 16, 16, 0.25f}, 9, 0, 4},        // tiny heads
      {{6, 2, 48, 72, 0.2f}, 45, 30, 16},      // GQA 3, v 72: an odd count of 8-dim parts (v3)
      // Chunked prefill of 16+ tokens over a cached context (v3, v4: K transposed per call): a
      // last chunk of 8 keys, and a page size that splits the 8-key transpose blocks.
      {{12, 4, 64, 64, 0.125f}, 200, 131, 16},
      {{8, 2, 32, 48, 0.2f}, 93, 70, 5},
      {{4, 2, 128, 128, 0.09f}, 81, 40, 16},   // q/k 128: the other unrolled tile
  };
  for (const AttnCase& c : cases) {
    const AttentionDims& d = c.d;
    const int64_t n = c.len - c.ctx;
    const auto k = randn(c.len * d.num_kv_heads * d.qk_dim, 10), v = randn(c.len * d.num_kv_heads * d.v_dim, 11);
    auto q = randn(c.len * d.num_heads * d.qk_dim, 12);
    const std::string name = "heads " + std::to_string(d.num_heads) + "/" + std::to_string(d.num_kv_heads) + " qk " +
                             std::to_string(d.qk_dim) + " v " + std::to_string(d.v_dim) + " len " +
                             std::to_string(c.len);
    // The whole sequence as new tokens over its own rows, with the log-sum-exp.
    expect_same(
        [&](const KernelTable& t) {
          std::vector<float> out(c.len * d.num_heads * d.v_dim), lse(c.len * d.num_heads);
          AttentionSeq seq{0, static_cast<int32_t>(c.len), 0, nullptr};
          AttentionScratch scratch;
          t.attention(q.data(), KvSource{k.data(), v.data(), 0}, &seq, 1, d, out.data(), scratch, lse.data());
          out.insert(out.end(), lse.begin(), lse.end());
          return out;
        },
        "attention, own rows, " + name);
    // The last n tokens new, the rest cached in shuffled pages, f32 and bf16 K/V.
    const int64_t ps = c.page_size, pages = (c.len + ps - 1) / ps;
    std::vector<int32_t> table(static_cast<size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(7));
    std::vector<float> kp, vp;
    to_pages(k, c.len, d.num_kv_heads, d.qk_dim, ps, table, kp);
    to_pages(v, c.len, d.num_kv_heads, d.v_dim, ps, table, vp);
    const auto kh = to_bits(kp, DType::kBF16), vh = to_bits(vp, DType::kBF16);
    const std::vector<float> qn(q.begin() + c.ctx * d.num_heads * d.qk_dim, q.end());
    for (bool bf16 : {false, true}) {
      expect_same(
          [&](const KernelTable& t) {
            std::vector<float> out(n * d.num_heads * d.v_dim);
            AttentionSeq seq{0, static_cast<int32_t>(n), static_cast<int32_t>(c.ctx), table.data()};
            AttentionScratch scratch;
            const KvSource kv = bf16 ? KvSource{kh.data(), vh.data(), static_cast<int32_t>(ps), true}
                                     : KvSource{kp.data(), vp.data(), static_cast<int32_t>(ps), false};
            t.attention(qn.data(), kv, &seq, 1, d, out.data(), scratch, nullptr);
            return out;
          },
          std::string("attention, paged ") + (bf16 ? "bf16" : "f32") + ", " + name);
    }
  }
}

TEST_P(IsaIdentity, AttentionTrainingForwardAndBackward) {
  const AttnShape s{6, 2, 32, 24, 0.17f};
  const std::vector<AttnSpan> spans = {{0, 21}, {21, 40}, {61, 3}};
  const int64_t T = 64;
  const auto q = randn(T * s.heads * s.qk_dim, 20), k = randn(T * s.kv_heads * s.qk_dim, 21);
  const auto v = randn(T * s.kv_heads * s.v_dim, 22), dout = randn(T * s.heads * s.v_dim, 23);
  expect_same(
      [&](const KernelTable& t) {
        std::vector<float> out(T * s.heads * s.v_dim), lse(T * s.heads);
        std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
        t.attention_forward_train(q.data(), k.data(), v.data(), spans, s, out.data(), lse.data());
        t.attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), spans, s, dq.data(),
                             dk.data(), dv.data());
        for (const auto* part : {&lse, &dq, &dk, &dv}) out.insert(out.end(), part->begin(), part->end());
        return out;
      },
      "attention forward_train + backward");
}

// ---- the elementwise and row kernels ----

TEST_P(IsaIdentity, NormsAndResiduals) {
  for (int64_t dim : {1, 15, 16, 37, 768}) {
    const int64_t rows = 13;
    const auto x = randn(rows * dim, 30), delta = randn(rows * dim, 31), w = randn(dim, 32), dy = randn(rows * dim, 33);
    expect_same(
        [&](const KernelTable& t) {
          std::vector<float> y(rows * dim), xs = x, y2(rows * dim), rstd(rows), y3(rows * dim);
          std::vector<float> dx(rows * dim, 0.5f), dw(dim, 0.25f);
          t.rmsnorm(x.data(), rows, dim, w.data(), 1e-5f, y.data());
          t.add_rmsnorm(xs.data(), delta.data(), rows, dim, w.data(), 1e-6f, y2.data());
          t.rmsnorm_forward_train(x.data(), w.data(), rows, dim, 1e-5f, y3.data(), rstd.data());
          t.rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), rows, dim, dx.data(), true, dw.data());
          for (const auto* part : {&xs, &y2, &rstd, &y3, &dx, &dw}) y.insert(y.end(), part->begin(), part->end());
          return y;
        },
        "rmsnorm family, dim " + std::to_string(dim));
  }
}

TEST_P(IsaIdentity, RopeBothPairingsAndTables) {
  const int64_t tokens = 9, heads = 3, half = 12, stride = 40, offset = 8;
  std::vector<double> inv(half);
  for (int64_t f = 0; f < half; ++f) inv[f] = std::pow(10000.0, -2.0 * f / (2.0 * half));
  const std::vector<int32_t> pos = {0, 1, 7, 100, 4095, 3, 2, 9, 31};
  const auto x = randn(tokens * heads * stride, 40);
  for (bool adjacent : {false, true}) {
    expect_same(
        [&](const KernelTable& t) {
          std::vector<float> cos(tokens * half), sin(tokens * half), y = x;
          t.rope_sincos(inv.data(), half, pos.data(), tokens, adjacent, cos.data(), sin.data());
          const RopePairing pairing = adjacent ? RopePairing::kAdjacent : RopePairing::kHalf;
          t.rope_rotate(y.data(), tokens, heads, stride, offset, half, cos.data(), sin.data(), pairing, false);
          std::vector<float> z = y;  // the backward (inverse) of the rotated heads, and of the input
          t.rope_rotate(z.data(), tokens, heads, stride, offset, half, cos.data(), sin.data(), pairing, true);
          std::vector<float> w = x;
          t.rope_rotate(w.data(), tokens, heads, stride, 0, half, cos.data(), sin.data(), pairing, true);
          for (const auto* part : {&cos, &sin, &z, &w}) y.insert(y.end(), part->begin(), part->end());
          return y;
        },
        std::string("rope, ") + (adjacent ? "adjacent pairs" : "halves"));
  }
}

TEST_P(IsaIdentity, ActivationsAndSwiglu) {
  for (int64_t n : {1, 15, 17, 4096, 70000}) {
    const auto a = randn(n, 50, 3.0f), b = randn(n, 51), g = randn(n, 52);
    expect_same(
        [&](const KernelTable& t) {
          std::vector<float> out(n), x = a, y = a, da(n), db(n), sg(n);
          t.swiglu(a.data(), b.data(), n, out.data());
          t.mul_sigmoid(x.data(), g.data(), n);
          t.add_inplace(y.data(), b.data(), n);
          t.swiglu_backward(g.data(), a.data(), b.data(), n, da.data(), db.data());
          t.sigmoid_forward(a.data(), n, sg.data());
          for (const auto* part : {&x, &y, &da, &db, &sg}) out.insert(out.end(), part->begin(), part->end());
          return out;
        },
        "activations, n " + std::to_string(n));
  }
}

TEST_P(IsaIdentity, ExpSoftmaxAndLosses) {
  std::vector<float> x;
  for (float v = -100.0f; v <= 100.0f; v += 0.173f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 88.0f, -87.0f, 88.5f, -87.5f, INFINITY, -INFINITY, 1e-30f, -1e-30f}) x.push_back(v);
  expect_same(
      [&](const KernelTable& t) {
        std::vector<float> y(x.size());
        t.exp_values(x.data(), static_cast<int64_t>(x.size()), y.data());
        return y;
      },
      "exp");
  const int64_t rows = 7, vocab = 1000;
  const auto logits = randn(rows * vocab, 60, 4.0f), dlogp = randn(rows, 61);
  const std::vector<int32_t> targets = {3, -1, 999, 0, 500, 17, 250};
  for (float eps : {0.0f, 0.1f}) {
    expect_same(
        [&](const KernelTable& t) {
          std::vector<float> out(vocab), sm(vocab), loss(rows), d(rows * vocab), lp(rows), dl(rows * vocab);
          t.softmax(logits.data(), vocab, sm.data());
          t.log_softmax(logits.data(), vocab, out.data());
          out.push_back(static_cast<float>(t.logsumexp(logits.data(), vocab)));
          out.push_back(static_cast<float>(
              t.cross_entropy_forward_backward(logits.data(), targets.data(), rows, vocab, eps, 0.5f, loss.data(), d.data())));
          t.token_logprobs(logits.data(), targets.data(), rows, vocab, lp.data());
          t.token_logprobs_backward(logits.data(), targets.data(), dlogp.data(), rows, vocab, dl.data());
          for (const auto* part : {&sm, &loss, &d, &lp, &dl}) out.insert(out.end(), part->begin(), part->end());
          return out;
        },
        "softmax and losses, label smoothing " + std::to_string(eps));
  }
}

// Every 16-bit pattern, NaNs and subnormals included, widens to the same f32 bits.
TEST_P(IsaIdentity, EmbeddingWidensEveryBf16AndF16Pattern) {
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), uint16_t{0});
  const std::vector<int32_t> ids = {0};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    expect_same(
        [&](const KernelTable& t) {
          std::vector<uint32_t> bits(65536);
          t.embedding(all.data(), dt, 65536, ids.data(), 1, reinterpret_cast<float*>(bits.data()));
          return bits;
        },
        std::string("embedding ") + std::string(dtype_name(dt)));
  }
  const auto table = randn(50 * 33, 70);
  const std::vector<int32_t> rows = {4, 0, 49, 4};
  expect_same(
      [&](const KernelTable& t) {
        std::vector<float> out(rows.size() * 33);
        t.embedding(table.data(), DType::kF32, 33, rows.data(), static_cast<int64_t>(rows.size()), out.data());
        return out;
      },
      "embedding F32");
}

INSTANTIATE_TEST_SUITE_P(Levels, IsaIdentity, ::testing::ValuesIn(levels_besides_generic()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

// ---- the table and the choice of level ----

TEST(IsaTables, EveryEntryOfEverySupportedLevelIsFilled) {
  for (Isa isa : cpu_info().supported) {
    const KernelTable& t = kernel_table(isa);
    EXPECT_EQ(t.isa, isa);
    const auto* fns = reinterpret_cast<void* const*>(reinterpret_cast<const char*>(&t) + offsetof(KernelTable, linear));
    // The entry points, from linear up to the peak probe's loops (tested by peak_test.cc).
    const size_t count = (offsetof(KernelTable, peak) - offsetof(KernelTable, linear)) / sizeof(void*);
    for (size_t i = 0; i < count; ++i) EXPECT_NE(fns[i], nullptr) << isa_name(isa) << " entry " << i;
  }
}

TEST(IsaTables, DetectionAndErrors) {
  const CpuInfo& info = cpu_info();
  ASSERT_FALSE(info.supported.empty());
  EXPECT_EQ(info.supported.front(), Isa::kGeneric);
  EXPECT_EQ(best_isa(), info.supported.back());
  EXPECT_EQ(parse_isa("v3"), Isa::kV3);
  try {
    parse_isa("v5");
    FAIL() << "v5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("auto, generic, v3, v4 or neon"), std::string::npos) << e.what();
  }
  // A level of the other architecture is not built in; a level beyond the CPU is refused.
  const Isa foreign = info.arch == "aarch64" ? Isa::kV4 : Isa::kNeon;
  EXPECT_THROW(kernel_table(foreign), Error);
  for (Isa isa : compiled_isas()) {
    if (isa_supported(isa)) continue;
    try {
      select_isa(isa_name(isa));
      FAIL() << "selected a level this CPU lacks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot run level"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace astrai::kernels
