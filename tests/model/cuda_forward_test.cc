// The whole forward on the CUDA backend against the CPU backend: the same Transformer code
// over the other backend::Ops, on random-weight models of three families (GQA, qwen3 qk-norm,
// MLA with the attention gate). Without a cache on a ragged batch, and through device pages:
// a chunked prefill and greedy decode steps (tokens equal, logits close). Built with the CUDA
// backend; skipped, saying why, without a GPU (scripts/gpu-check.sh runs it on one).
//
// Tolerances: f32 weights, logits within 1e-4 (|got - want| <= 1e-4 (1 + |want|)): other
// summation orders in cuBLAS and the kernels; bf16 weights within 5e-2: the CUDA path rounds
// activations to bf16 before each product, the CPU path keeps them in f32.
#if ASTRAI_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../model_families.h"
#include "backend/cuda/cuda_ops.h"
#include "model/transformer.h"

namespace astrai::model {
namespace {

ModelWeights random_weights(const ModelConfig& c, DType dtype) { return testing_util::random_weights(c, 11, dtype); }

// Zeroed pages for every layer in one backend's memory.
struct Pages {
  const backend::Ops& ops;
  PagedKv kv;
  Pages(const Transformer& m, const backend::Ops& o, int32_t page_size, int32_t pages) : ops(o) {
    kv = m.kv_geometry(page_size, DType::kF32);
    const size_t k = size_t(pages) * page_size * kv.num_kv_heads * kv.k_head_dim * sizeof(float);
    const size_t v = size_t(pages) * page_size * kv.num_kv_heads * kv.v_head_dim * sizeof(float);
    const std::vector<char> zeros(std::max(k, v), 0);
    for (int64_t l = 0; l < m.config().num_hidden_layers; ++l) {
      kv.k_pages.push_back(ops.alloc(k));
      kv.v_pages.push_back(ops.alloc(v));
      ops.to_device(kv.k_pages.back(), zeros.data(), k);
      ops.to_device(kv.v_pages.back(), zeros.data(), v);
    }
  }
  ~Pages() {
    for (void* p : kv.k_pages) ops.release(p);
    for (void* p : kv.v_pages) ops.release(p);
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - want[i]), tol * (1.0 + std::fabs(want[i])))
        << what << ": logit " << i << " got " << got[i] << " want " << want[i];
}

class CudaForward : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why;
    if (!backend::cuda::available(&why)) GTEST_SKIP() << "no GPU here: " << why;
  }
};

TEST_P(CudaForward, MatchesTheCpuWithoutACacheAndThroughPages) {
  const ModelConfig c = ModelConfig::from_json(testing_util::cuda_test_family(GetParam()));
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const double tol = dtype == DType::kF32 ? 1e-4 : 5e-2;
    const ModelWeights w = random_weights(c, dtype);
    const Transformer cpu(c, w, Device::kCpu), gpu(c, w, Device::kCuda);
    EXPECT_EQ(gpu.device(), Device::kCuda);
    const int64_t V = c.vocab_size;

    // A ragged batch, no cache, every row's logits.
    Batch b;
    b.add_sequence({1, 5, 9, 13, 17, 21, 25});
    b.add_sequence({2, 4, 8});
    ForwardWorkspace wc, wg;
    std::vector<float> want(static_cast<size_t>(b.num_tokens() * V)), got(want.size());
    cpu.forward(b, nullptr, wc, want.data());
    gpu.forward(b, nullptr, wg, got.data());
    expect_close(got, want, tol, "ragged batch");

    // Prefill 9 tokens in chunks of 5 and 4 through pages (page size 4, pages out of order),
    // then 4 greedy decode steps.
    Pages pc(cpu, backend::cpu_ops(), 4, 8), pg(gpu, backend::ops_for(Device::kCuda), 4, 8);
    const std::vector<int32_t> table = {6, 2, 7, 0, 5};
    std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5};
    int32_t done = 0;
    for (int32_t chunk : {5, 4, 1, 1, 1, 1}) {
      Batch s;
      s.add_sequence(std::vector<int32_t>(ids.begin() + done, ids.begin() + done + chunk), done, table);
      s.logit_rows = {chunk - 1};
      std::vector<float> lc(static_cast<size_t>(V)), lg(lc.size());
      cpu.forward(s, &pc.kv, wc, lc.data());
      gpu.forward(s, &pg.kv, wg, lg.data());
      expect_close(lg, lc, tol, "paged step at position " + std::to_string(done));
      done += chunk;
      if (done == static_cast<int32_t>(ids.size())) {
        const auto next_cpu = std::max_element(lc.begin(), lc.end()) - lc.begin();
        if (dtype == DType::kF32) {
          EXPECT_EQ(std::max_element(lg.begin(), lg.end()) - lg.begin(), next_cpu);
        }
        ids.push_back(static_cast<int32_t>(next_cpu));  // both continue with the CPU's token
      }
    }
  }
}

// Two sequences prefilled (5 and 9 tokens, page size 2, pages interleaved), then `steps`
// decode steps of both. The next tokens are tokens[step] when given, else each sequence's
// argmax (appended to tokens). Returns every step's logits, both sequences' rows.
std::vector<std::vector<float>> decode_two(const Transformer& m, const backend::Ops& ops, int steps,
                                           std::vector<std::array<int32_t, 2>>& tokens) {
  const int32_t ps = 2, pages_per_seq = (9 + steps + ps) / ps;
  Pages pages(m, ops, ps, 2 * pages_per_seq);
  std::array<std::vector<int32_t>, 2> tables;
  for (int32_t s = 0; s < 2; ++s)
    for (int32_t p = 0; p < pages_per_seq; ++p) tables[s].push_back(2 * p + s);
  const std::array<std::vector<int32_t>, 2> prompts = {std::vector<int32_t>{3, 1, 4, 1, 5},
                                                      std::vector<int32_t>{9, 2, 6, 5, 3, 5, 8, 9, 7}};
  const int64_t V = m.config().vocab_size;
  ForwardWorkspace ws;
  std::vector<std::vector<float>> all;
  std::array<int32_t, 2> next{}, len{5, 9};
  for (int step = 0; step <= steps; ++step) {
    Batch b;
    for (int32_t s = 0; s < 2; ++s) {
      if (step == 0) b.add_sequence(prompts[s], 0, tables[s]);
      else b.add_sequence({next[s]}, len[s]++, tables[s]);
      b.logit_rows.push_back(b.num_tokens() - 1);
    }
    std::vector<float> logits(static_cast<size_t>(2 * V));
    m.forward(b, &pages.kv, ws, logits.data());
    if (static_cast<size_t>(step) == tokens.size()) {
      for (int32_t s = 0; s < 2; ++s)
        next[s] = static_cast<int32_t>(std::max_element(logits.begin() + s * V, logits.begin() + (s + 1) * V) -
                                       (logits.begin() + s * V));
      tokens.push_back(next);
    } else {
      next = tokens[static_cast<size_t>(step)];
    }
    all.push_back(std::move(logits));
  }
  return all;
}

class CudaDecodeGraphs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!backend::cuda::available(&why)) GTEST_SKIP() << "no GPU here: " << why;
  }
  void TearDown() override {
    if (backend::cuda::available()) backend::cuda::set_graphs(true);
  }
};

// Decode steps replayed as CUDA graphs give the bits of the same steps run op by op, while
// the positions and page tables change every step and the tables outgrow their stride once
// (a step that runs uncached and is captured again); both agree with the CPU backend on the
// same tokens (f32 weights within 1e-4, bf16 within 5e-2 as above; the attention splits each
// query over its keys here). Nearly every step must be a replay: a step whose preparation
// differs from its capture still gives the right bits, uncached, so only the count shows it.
TEST_F(CudaDecodeGraphs, ReplayedStepsGiveTheBitsOfStepsRunOpByOp) {
  const ModelConfig c = ModelConfig::from_json(testing_util::cuda_test_family("qwen3"));
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const double tol = dtype == DType::kF32 ? 1e-4 : 5e-2;
    const ModelWeights w = random_weights(c, dtype);
    const Transformer gpu(c, w, Device::kCuda), cpu(c, w, Device::kCpu);
    const backend::Ops& cuda = backend::ops_for(Device::kCuda);
    const int steps = 150;
    std::vector<std::array<int32_t, 2>> tokens;
    backend::cuda::set_graphs(false);
    const auto op_by_op = decode_two(gpu, cuda, steps, tokens);
    backend::cuda::set_graphs(true);
    const int64_t replays = backend::cuda::graph_replays();
    const auto replayed = decode_two(gpu, cuda, steps, tokens);
    EXPECT_GE(backend::cuda::graph_replays() - replays, steps - 10);
    const auto on_cpu = decode_two(cpu, backend::cpu_ops(), steps, tokens);
    ASSERT_EQ(replayed.size(), op_by_op.size());
    for (size_t i = 0; i < replayed.size(); ++i) {
      ASSERT_EQ(replayed[i], op_by_op[i]) << "step " << i << ": a replayed graph differs from the step run op by op";
      expect_close(replayed[i], on_cpu[i], tol, "decode step " + std::to_string(i));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaForward, ::testing::Values("llama", "qwen3", "mla"));

}  // namespace
}  // namespace astrai::model

#endif  // ASTRAI_HAVE_CUDA
