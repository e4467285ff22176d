// Training steps on the CUDA backend against the same steps on the CPU: TrainModel's forward
// and backward, the cross-entropy loss, the gradient norm and clipping, and AdamW, on three
// families (GQA with tied embeddings and label smoothing; qwen3 qk-norm with biases; MLA with
// the attention gate, recomputing activations in the backward), four updates each. Built with the CUDA backend; skipped, saying why,
// without a GPU (scripts/gpu-check.sh runs it on one).
//
// Tolerances, f32 everywhere: cuBLAS and the kernels sum in other orders (ops.h), so
//   - the first update's gradients: max abs error <= 1e-4 x the tensor's max abs gradient
//     (the PyTorch oracle's bound, tests/train/oracle_train.py) and its norm within 1e-5;
//   - every update's loss within 1e-4 relative;
//   - the weights after four updates: AdamW moves each weight by about lr per update whatever
//     the gradient's size, so a weight whose gradient is near 0 may move the other way on the
//     GPU. Bound: no weight differs by more than 2·lr per update, and 99.9% within 1e-5.
#if ASTRAI_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../model_families.h"
#include "backend/cuda/cuda_ops.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/shards.h"
#include "train/strategy.h"

namespace astrai::train {
namespace {

// tests/model_families.h's families; llama with a tied LM head (its gradient is the embedding's
// too) and qwen3 with q/k/v biases, so their gradients are checked as well.
Json family(const std::string& kind) {
  Json j = testing_util::cuda_test_family(kind);
  j["tie_word_embeddings"] = kind == "llama";
  if (kind == "qwen3") j["attention_bias"] = true;
  return j;
}

// Documents of several lengths; a few targets ignored (as SFT masks prompts).
TrainBatch random_batch(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  TrainBatch b;
  for (int n : {37, 6, 61, 20}) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::vector<uint8_t> mask(ids.size(), 1);
    for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    for (size_t i = 0; i < mask.size(); i += 7) mask[i] = 0;
    b.add_document(ids, &mask);
  }
  return b;
}

std::vector<float> to_host(const FloatBuffer& b) {
  const FloatBuffer h = on_host(b);
  return std::vector<float>(h.data(), h.data() + h.size());
}

// One update as the trainer makes it: zero, loss + backward, norm, clip, AdamW. Returns the loss.
struct Side {
  TrainModel model;
  AdamW adam;
  CrossEntropyStrategy loss;
  Side(const model::ModelConfig& c, Device d, float smoothing, bool recompute)
      : model(c, recompute, true, d), adam(model.layout(), AdamWConfig{}, model.ops()), loss("seq", smoothing) {
    model.init_weights(5, 0.05f);
  }
  double forward_backward(const TrainBatch& b) {
    model.zero_grads();
    return loss.run(model, b, 1.0f).loss();
  }
  double norm(const ShardPlan& plan) {
    std::vector<double> partials(plan.blocks().size());
    block_sq_norms(model.grads().data(), plan.blocks(), 0, plan.blocks().size(), partials.data(), model.ops());
    return grad_norm_from_blocks(partials);
  }
  void update(double norm, float lr) {
    scale_grads(model.grads().data(), 0, model.grads().size(), clip_coefficient(norm, 1.0), model.ops());
    adam.step(model.params().data(), model.grads().data(), lr);
  }
};

TEST(CudaTraining, StepsMatchTheCpuTrainer) {
  std::string why;
  if (!backend::cuda::available(&why)) GTEST_SKIP() << "no GPU here: " << why;
  const float lr = 1e-3f;
  const int updates = 4;
  for (const std::string kind : {"llama", "qwen3", "mla"}) {
    const auto config = model::ModelConfig::from_json(family(kind), kind);
    const float smoothing = kind == "llama" ? 0.1f : 0.0f;
    const bool recompute = kind == "mla";  // the backward recomputes each layer's forward
    Side cpu(config, Device::kCpu, smoothing, recompute), gpu(config, Device::kCuda, smoothing, recompute);
    ASSERT_EQ(to_host(gpu.model.params()), to_host(cpu.model.params())) << kind << ": the same initial weights";
    const ShardPlan plan(cpu.model.layout().specs(), cpu.model.layout().total(), 1);
    for (int u = 0; u < updates; ++u) {
      const TrainBatch b = random_batch(config.vocab_size, 100 + static_cast<uint32_t>(u));
      const double want = cpu.forward_backward(b), got = gpu.forward_backward(b);
      EXPECT_NEAR(got, want, 1e-4 * std::fabs(want)) << kind << " update " << u + 1 << " loss";
      const double want_norm = cpu.norm(plan), got_norm = gpu.norm(plan);
      if (u == 0) {
        EXPECT_NEAR(got_norm, want_norm, 1e-5 * want_norm) << kind << " gradient norm";
        const std::vector<float> gg = to_host(gpu.model.grads()), cg = to_host(cpu.model.grads());
        for (const ParamSpec& s : cpu.model.layout().specs()) {
          float scale = 0.0f, worst = 0.0f;
          for (size_t i = s.offset; i < s.offset + s.numel; ++i) {
            scale = std::max(scale, std::fabs(cg[i]));
            worst = std::max(worst, std::fabs(gg[i] - cg[i]));
          }
          EXPECT_LE(worst, 1e-4f * scale + 1e-12f) << kind << ": gradient of " << s.name;
        }
      }
      cpu.update(want_norm, lr);
      gpu.update(got_norm, lr);
    }
    const std::vector<float> gp = to_host(gpu.model.params()), cp = to_host(cpu.model.params());
    size_t loose = 0;
    float worst = 0.0f;
    for (size_t i = 0; i < cp.size(); ++i) {
      const float d = std::fabs(gp[i] - cp[i]);
      worst = std::max(worst, d);
      loose += d > 1e-5f;
    }
    EXPECT_LE(worst, 2.0f * lr * updates) << kind << ": weights after " << updates << " updates";
    EXPECT_LE(static_cast<double>(loose), 1e-3 * static_cast<double>(cp.size()))
        << kind << ": weights differing by more than 1e-5 after " << updates << " updates";
  }
}

// Checkpoints and the CLI read the weights through host copies.
TEST(CudaTraining, WeightsComeBackToTheHost) {
  std::string why;
  if (!backend::cuda::available(&why)) GTEST_SKIP() << "no GPU here: " << why;
  const auto config = model::ModelConfig::from_json(family("llama"), "llama");
  TrainModel gpu(config, false, true, Device::kCuda), cpu(config);
  gpu.init_weights(9);
  cpu.load_weights(gpu.weights(), "the GPU model's weights");
  EXPECT_EQ(to_host(cpu.params()), to_host(gpu.params()));
  for (const auto& [name, t] : gpu.weights()) EXPECT_EQ(t.device(), Device::kCpu) << name;
}

}  // namespace
}  // namespace astrai::train

#endif  // ASTRAI_HAVE_CUDA
