// Unit tests of the training layer: per-op backward kernels against central finite
// differences (in double, through the f32 kernels), schedules, AdamW and clipping, the
// inference view over live trainer weights, and HF save/load round trips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/cross_entropy_backward.h"
#include "kernels/cpu/linear_backward.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm_backward.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu_backward.h"
#include "model/transformer.h"
#include "infer/backend.h"
#include "infer/engine.h"
#include "data/shard.h"
#include "train/batch_source.h"
#include "train/dpo.h"
#include "train/rewards.h"
#include "train/live_model.h"
#include "train/lora.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/strategy.h"

namespace astrai::train {
namespace {

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Checks analytic d(Σ w∘f(x))/dx against central differences of the f32 forward.
void expect_grad(std::vector<float>& x, const std::vector<float>& analytic,
                 const std::function<double()>& loss, double tol = 2e-2) {
  const float h = 1e-2f;
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    const double num = (lp - lm) / (2.0 * h);
    max_ref = std::max(max_ref, std::abs(num));
    max_err = std::max(max_err, std::abs(num - analytic[i]));
  }
  EXPECT_LE(max_err, tol * std::max(max_ref, 1e-3)) << "max |num - analytic| " << max_err << " of " << max_ref;
}

double weighted_sum(const std::vector<float>& y, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * w[i];
  return s;
}

TEST(TrainKernels, RmsNormBackward) {
  const int64_t rows = 3, dim = 8;
  auto x = randn(rows * dim, 1), w = randn(dim, 2), dy = randn(rows * dim, 3);
  std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dw(dim, 0.0f);
  auto loss = [&] {
    kernels::rmsnorm_forward_train(x.data(), w.data(), rows, dim, 1e-6f, y.data(), rstd.data());
    return weighted_sum(y, dy);
  };
  loss();
  kernels::rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), rows, dim, dx.data(), false, dw.data());
  expect_grad(x, dx, loss);
  expect_grad(w, dw, loss);
}

TEST(TrainKernels, LinearBackward) {
  const int64_t m = 4, n = 5, k = 6;
  auto x = randn(m * k, 4), w = randn(n * k, 5), b = randn(n, 6), dy = randn(m * n, 7);
  std::vector<float> y(m * n), dx(m * k), dw(n * k, 0.0f), db(n, 0.0f);
  auto loss = [&] {
    kernels::linear(x.data(), m, kernels::WeightView{w.data(), DType::kF32, n, k}, b.data(), y.data());
    return weighted_sum(y, dy);
  };
  kernels::linear_backward_f32(dy.data(), x.data(), m, w.data(), n, k, dx.data(), false, dw.data(), db.data());
  expect_grad(x, dx, loss);
  expect_grad(w, dw, loss);
  expect_grad(b, db, loss);
}

TEST(TrainKernels, SwigluBackward) {
  const int64_t n = 16;
  auto a = randn(n, 8, 2.0f), b = randn(n, 9), dh = randn(n, 10);
  std::vector<float> h(n), da(n), db(n);
  auto loss = [&] {
    kernels::swiglu(a.data(), b.data(), n, h.data());
    return weighted_sum(h, dh);
  };
  kernels::swiglu_backward(dh.data(), a.data(), b.data(), n, da.data(), db.data());
  expect_grad(a, da, loss);
  expect_grad(b, db, loss);
}

TEST(TrainKernels, RopeBackwardIsTranspose) {
  for (auto pairing : {kernels::RopePairing::kHalf, kernels::RopePairing::kAdjacent}) {
    const int64_t T = 5, H = 2, hd = 10, rot = 8, offset = hd - rot;  // RoPE on the trailing 8 features
    const std::vector<double> inv = {1.0, 0.1, 0.01, 0.001};  // rot / 2 frequencies
    std::vector<int32_t> pos = {0, 3, 1, 7, 10};
    std::vector<float> cos(T * rot / 2), sin(T * rot / 2);
    kernels::rope_sincos(inv.data(), rot / 2, pos.data(), T, true, cos.data(), sin.data());
    auto x = randn(T * H * hd, 11), dy = randn(T * H * hd, 12);
    std::vector<float> y, dx = dy;
    auto loss = [&] {
      y = x;
      kernels::rope_rotate(y.data(), T, H, hd, offset, rot / 2, cos.data(), sin.data(), pairing, false);
      return weighted_sum(y, dy);
    };
    kernels::rope_rotate(dx.data(), T, H, hd, offset, rot / 2, cos.data(), sin.data(), pairing, true);
    expect_grad(x, dx, loss);
  }
}

TEST(TrainKernels, AttentionBackwardPerDocument) {
  const kernels::AttnShape s{4, 2, 6, 5, 0.4f};
  const std::vector<kernels::AttnSpan> spans = {{0, 3}, {3, 1}, {4, 4}};
  const int64_t T = 8;
  auto q = randn(T * 4 * 6, 13), k = randn(T * 2 * 6, 14), v = randn(T * 2 * 5, 15), dout = randn(T * 4 * 5, 16);
  std::vector<float> out(T * 4 * 5), lse(T * 4), dq(q.size()), dk(k.size()), dv(v.size());
  auto loss = [&] {
    kernels::attention_forward_train(q.data(), k.data(), v.data(), spans, s, out.data(), lse.data());
    return weighted_sum(out, dout);
  };
  loss();
  kernels::attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), spans, s,
                              dq.data(), dk.data(), dv.data());
  expect_grad(q, dq, loss);
  expect_grad(k, dk, loss);
  expect_grad(v, dv, loss);
  // Documents are independent: the second document (one token) attends only to itself.
  for (int h = 0; h < 4; ++h)
    for (int d = 0; d < 5; ++d) EXPECT_FLOAT_EQ(out[(3 * 4 + h) * 5 + d], v[(3 * 2 + h / 2) * 5 + d]);
}

TEST(TrainKernels, CrossEntropyWithLabelSmoothing) {
  const int64_t rows = 3, V = 7;
  auto z = randn(rows * V, 17, 2.0f);
  std::vector<int32_t> t = {2, kIgnore, 6};
  std::vector<float> row(rows), dz(rows * V);
  auto loss = [&] {
    return kernels::cross_entropy_forward_backward(z.data(), t.data(), rows, V, 0.1f, 0.0f, row.data(), nullptr);
  };
  kernels::cross_entropy_forward_backward(z.data(), t.data(), rows, V, 0.1f, 1.0f, row.data(), dz.data());
  EXPECT_EQ(row[1], 0.0f);
  expect_grad(z, dz, loss);
  std::vector<float> lp(rows), dlp = {1.0f, 0.0f, -2.0f}, dzl(rows * V);
  auto lp_loss = [&] {
    kernels::token_logprobs(z.data(), t.data(), rows, V, lp.data());
    return weighted_sum(lp, dlp);
  };
  kernels::token_logprobs_backward(z.data(), t.data(), dlp.data(), rows, V, dzl.data());
  expect_grad(z, dzl, lp_loss);
}

TEST(TrainSchedule, CosineWarmupSgdrWsd) {
  ScheduleConfig c;
  c.max_lr = 1.0;
  c.min_lr_ratio = 0.1;
  c.warmup_steps = 10;
  c.total_steps = 110;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);
  EXPECT_NEAR(learning_rate(c, 60), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(c, 110), 0.1, 1e-12);
  c.kind = "sgdr";
  c.cycle_steps = 20;
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);
  EXPECT_NEAR(learning_rate(c, 20), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(c, 30), 1.0);  // restart; the next cycle is 40 long
  EXPECT_NEAR(learning_rate(c, 50), 0.55, 1e-12);
  c.kind = "wsd";
  c.decay_ratio = 0.2;
  EXPECT_DOUBLE_EQ(learning_rate(c, 50), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 89), 1.0);
  EXPECT_NEAR(learning_rate(c, 99), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(c, 109), 0.1, 1e-12);
  c.kind = "bogus";
  EXPECT_THROW(validate_schedule(c), Error);
}

TEST(TrainOptimizer, ClipUsesGlobalNorm) {
  std::vector<float> g = {3.0f, 0.0f, 4.0f};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 3, 1.0), 5.0);
  EXPECT_NEAR(g[0], 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(g[2], 4.0 / (5.0 + 1e-6), 1e-7);
  std::vector<float> h = {0.3f, 0.4f};
  clip_grad_norm(h.data(), 2, 1.0);
  EXPECT_FLOAT_EQ(h[0], 0.3f);  // below the threshold: untouched
}

Json tiny_config() {
  return Json{{"model_type", "qwen2"}, {"vocab_size", 50}, {"hidden_size", 32}, {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
              {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"tie_word_embeddings", false},
              {"max_position_embeddings", 64}};
}

TEST(TrainOptimizer, AdamWDecaysOnlyMatrices) {
  TrainModel m(model::ModelConfig::from_json(tiny_config(), "tiny"));
  m.init_weights(1);
  AdamWConfig c;
  c.weight_decay = 0.5f;
  AdamW adam(m.layout(), c);
  std::vector<float> before(m.params().data(), m.params().data() + m.params().size());
  m.zero_grads();
  adam.step(m.params().data(), m.grads().data(), 0.1f);  // zero gradients: only decay acts
  for (const auto& s : m.layout().specs()) {
    const float* p = m.params().data() + s.offset;
    const float expect = s.kind == model::ParamKind::kMatrix ? 0.95f : 1.0f;
    for (size_t i = 0; i < s.numel; ++i) ASSERT_FLOAT_EQ(p[i], before[s.offset + i] * expect) << s.name;
  }
}

// The trainer's forward on live weights gives model::Transformer's logits (the inference
// forward) bit for bit, before and after an optimizer step, per config.
void expect_view_matches_trainer(const Json& config_json) {
  const auto config = model::ModelConfig::from_json(config_json, "cfg");
  TrainModel m(config);
  m.init_weights(3, 0.2f);
  model::Transformer view(config, live_weights(m.weights(), config));
  // Documents of different lengths (dynamic RoPE rescales each by its own longest position).
  std::vector<std::vector<int32_t>> docs;
  std::mt19937 rng(7);
  for (int n : {5, 3, 41, 20}) {
    std::vector<int32_t> d(static_cast<size_t>(n));
    for (auto& t : d) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(config.vocab_size));
    docs.push_back(d);
  }
  TrainBatch tb;
  for (const auto& d : docs) tb.add_document(d);
  auto check_same = [&] {
    const float* ours = m.forward(tb);
    model::Batch b;
    for (const auto& d : docs) b.add_sequence(std::vector<int32_t>(d.begin(), d.end() - 1));
    model::ForwardWorkspace ws;
    std::vector<float> logits(static_cast<size_t>(b.num_tokens()) * config.vocab_size);
    view.forward(b, nullptr, ws, logits.data());
    float scale = 0.0f;
    for (float v : logits) scale = std::max(scale, std::fabs(v));
    double worst = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::fabs(double(logits[i]) - ours[i]) / scale);
    EXPECT_EQ(worst, 0.0) << config.summary() << ": the training forward must give the inference forward's bits";
    EXPECT_EQ(std::memcmp(logits.data(), ours, logits.size() * sizeof(float)), 0) << config.summary();
  };
  check_same();
  // An optimizer step on the trainer's buffer is seen by the inference view.
  CrossEntropyStrategy ce("seq", 0.0f);
  m.zero_grads();
  ce.run(m, tb, 1.0f);
  AdamW adam(m.layout(), AdamWConfig{});
  adam.step(m.params().data(), m.grads().data(), 1e-2f);
  check_same();
}

TEST(TrainLiveWeights, TransformerViewMatchesTrainerForward) { expect_view_matches_trainer(tiny_config()); }

Json mla_config() {
  return Json{{"model_type", "autoregressive_lm"}, {"vocab_size", 50}, {"hidden_size", 32},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 4},
              {"intermediate_size", 48}, {"kv_lora_rank", 8}, {"qk_nope_head_dim", 6},
              {"qk_rope_head_dim", 4}, {"v_head_dim", 5}, {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", false}, {"attention_bias", true}, {"max_position_embeddings", 64}};
}

TEST(TrainLiveWeights, TransformerViewMatchesTrainerForwardMla) { expect_view_matches_trainer(mla_config()); }

TEST(TrainLiveWeights, TransformerViewMatchesTrainerForwardMlaGateDynamic) {
  Json c = mla_config();
  c["num_key_value_heads"] = 2;
  c["use_gated_attention"] = true;
  c["tie_word_embeddings"] = true;
  c["mlp_bias"] = true;
  c["max_position_embeddings"] = 16;
  c["rope_scaling"] = Json{{"type", "dynamic"}, {"factor", 2.0}};
  expect_view_matches_trainer(c);
}

TEST(TrainLiveWeights, TransformerViewMatchesTrainerForwardQkNormGateMqa) {
  Json c = tiny_config();
  c["model_type"] = "qwen3";
  c["num_key_value_heads"] = 1;
  c["head_dim"] = 12;
  c["tie_word_embeddings"] = true;
  expect_view_matches_trainer(c);
  c["model_type"] = "autoregressive_lm";  // the reference's qk-norm after RoPE, adjacent pairs, gate
  c["use_qk_norm"] = true;
  c["use_gated_attention"] = true;
  expect_view_matches_trainer(c);
}

TEST(TrainLiveWeights, TransformerViewMatchesTrainerForwardMlpBiasDynamic) {
  Json c = tiny_config();
  c["model_type"] = "llama";
  c["mlp_bias"] = true;
  c["max_position_embeddings"] = 16;
  c["rope_scaling"] = Json{{"type", "dynamic"}, {"factor", 2.0}};
  expect_view_matches_trainer(c);
}

TEST(TrainLiveWeights, SavedWeightsLoadInModelLayer) {
  const auto config = model::ModelConfig::from_json(tiny_config(), "tiny");
  TrainModel m(config);
  m.init_weights(4);
  const auto dir = std::filesystem::temp_directory_path() / ("astrai_train_save_" + std::to_string(::getpid()));
  save_hf_weights(dir.string(), m, config);
  auto ckpt = model::load_checkpoint(dir.string());
  TrainModel back(ckpt.config);
  back.load_weights(model::read_checkpoint_tensors(dir.string()).tensors, dir.string());
  for (size_t i = 0; i < m.params().size(); ++i) ASSERT_EQ(m.params().data()[i], back.params().data()[i]);
  std::filesystem::remove_all(dir);
}

// A frozen model views an f32 checkpoint where it is mapped (no owned copy) and converts a
// bf16 one once; both forwards equal a model that loaded the same values.
TEST(TrainModelTest, FrozenModelReadsF32CheckpointInPlace) {
  const auto config = model::ModelConfig::from_json(tiny_config(), "tiny");
  TrainModel m(config);
  m.init_weights(6, 0.2f);
  const auto dir = std::filesystem::temp_directory_path() / ("astrai_train_view_" + std::to_string(::getpid()));
  save_hf_weights(dir.string(), m, config);
  TrainBatch tb;
  tb.add_document({1, 2, 3, 4, 5, 6});
  tb.add_document({9, 8, 7});
  const float* expected = m.forward(tb);
  const std::vector<float> want(expected, expected + tb.num_tokens() * config.vocab_size);
  {
    auto contents = model::read_checkpoint_tensors(dir.string());
    TrainModel frozen(config, false, /*trainable=*/false);
    frozen.view_weights(contents.tensors, dir.string());
    EXPECT_EQ(frozen.params().size(), 0u) << "an f32 checkpoint is read in place";
    for (const auto& [name, t] : frozen.weights()) EXPECT_EQ(t.raw(), contents.tensors.at(name).raw()) << name;
    const float* got = frozen.forward(tb);
    EXPECT_EQ(std::memcmp(got, want.data(), want.size() * sizeof(float)), 0);
    EXPECT_THROW(frozen.backward(tb, const_cast<float*>(got)), Error) << "no adapters: nothing to train";
    EXPECT_THROW(m.view_weights(contents.tensors, "x"), Error) << "a trainable model owns its parameters";
  }
  // bf16: the matrices are read in place too (norms converted, each on its own); the
  // forward equals the f32 model holding the same rounded values, to the kernels' order.
  const auto bf16_dir = dir / "bf16";
  model::save_checkpoint(bf16_dir.string(), config, live_weights(m.weights(), config), DType::kBF16);
  auto contents = model::read_checkpoint_tensors(bf16_dir.string());
  TrainModel viewed(config, false, false), loaded(config, false, false);
  viewed.view_weights(contents.tensors, bf16_dir.string());
  loaded.load_weights(contents.tensors, bf16_dir.string());
  EXPECT_EQ(viewed.params().size(), 0u);
  for (const auto& [name, t] : viewed.weights()) {
    if (t.ndim() == 2) EXPECT_EQ(t.raw(), contents.tensors.at(name).raw()) << name << ": read in place";
    else EXPECT_EQ(t.dtype(), DType::kF32) << name << ": vectors converted";
  }
  const float* a = viewed.forward(tb);
  const std::vector<float> va(a, a + want.size());
  const float* b = loaded.forward(tb);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    worst = std::max(worst, std::fabs(double(va[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  EXPECT_LT(worst, 1e-5 * scale);
  std::filesystem::remove_all(dir);
}

// LoRA in the layers: with B ≠ 0 and no dropout, the forward is the merged model's (to f32
// rounding); dropout changes the training forward, not the evaluation one; the backward forms
// only the factors' gradients, and the same seed redraws the same masks.
TEST(TrainLora, AdaptersInLayersMatchMergedModel) {
  const auto config = model::ModelConfig::from_json(tiny_config(), "tiny");
  TrainModel full(config);
  full.init_weights(8, 0.2f);
  TrainModel base(config, false, false);
  base.view_weights(full.weights(), "full");
  LoraOptions lo;
  lo.rank = 3;
  lo.alpha = 6;
  lo.dropout = 0.4;
  LoraAdapters lora(base, lo, 9);
  const auto noise = randn(lora.params().size(), 10, 0.3f);
  std::copy(noise.begin(), noise.end(), lora.params().data());
  lora.refresh();
  base.set_adapters(lora.layer_adapters(), lo.rank);
  TrainModel merged(config, false, false);
  merged.view_weights(lora.merged_weights(), "merged");
  TrainBatch tb;
  tb.add_document({1, 2, 3, 4, 5, 6, 7});
  tb.add_document({9, 8, 7});
  const size_t n = static_cast<size_t>(tb.num_tokens() * config.vocab_size);
  const float* pm = merged.forward(tb);
  const std::vector<float> want(pm, pm + n);
  std::vector<float> eval_logits, train_logits;
  {
    const EvalMode eval(base);
    const float* p = base.forward(tb);
    eval_logits.assign(p, p + n);
  }
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(double(eval_logits[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  EXPECT_LT(worst, 1e-5 * scale) << "unmerged adapters = merged weights";
  base.set_dropout_seed(77);
  const float* p = base.forward(tb);
  train_logits.assign(p, p + n);
  EXPECT_NE(train_logits, eval_logits) << "dropout acts in training forwards";
  CrossEntropyStrategy ce("seq", 0.0f);
  auto grads_of = [&](uint64_t seed) {
    lora.zero_grads();
    base.set_dropout_seed(seed);
    ce.run(base, tb, 1.0f);
    return std::vector<float>(lora.grads().data(), lora.grads().data() + lora.grads().size());
  };
  const auto g1 = grads_of(77), g2 = grads_of(77), g3 = grads_of(78);
  EXPECT_EQ(g1, g2) << "the same seed draws the same masks";
  EXPECT_NE(g1, g3);
  double norm = 0;
  for (float g : g1) norm += double(g) * g;
  EXPECT_GT(norm, 0.0);
  EXPECT_EQ(base.grads().size(), 0u) << "no gradient buffer for the frozen base";
  // After an update of the factors, refresh() keeps the merged weights (GRPO's engine) current.
  for (size_t i = 0; i < lora.params().size(); ++i) lora.params().data()[i] -= 0.5f * g1[i];
  lora.refresh();
  const float* pm2 = merged.forward(tb);
  const std::vector<float> want2(pm2, pm2 + n);
  EXPECT_NE(want2, want);
  const EvalMode eval(base);
  const float* p2 = base.forward(tb);
  worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(p2[i]) - want2[i]));
  EXPECT_LT(worst, 1e-5 * scale);
}

// LoRA over a bf16 base read in place: the factors' gradients equal those over an f32 base
// holding the same (rounded) values, to summation order. vocab 300 > the 128-row blocks the
// backward widens the bf16 LM head by.
TEST(TrainLora, Bf16BaseGivesTheF32BasesGradients) {
  Json cj = tiny_config();
  cj["vocab_size"] = 300;
  const auto config = model::ModelConfig::from_json(cj, "tiny");
  TrainModel full(config);
  full.init_weights(12, 0.2f);
  const auto dir = std::filesystem::temp_directory_path() / ("astrai_lora_bf16_" + std::to_string(::getpid()));
  model::save_checkpoint(dir.string(), config, live_weights(full.weights(), config), DType::kBF16);
  auto contents = model::read_checkpoint_tensors(dir.string());
  TrainModel b16(config, false, false), b32(config, false, false);
  b16.view_weights(contents.tensors, "bf16");
  b32.load_weights(contents.tensors, "bf16 widened");
  LoraOptions lo;
  lo.rank = 2;
  lo.targets = {"q", "o", "down"};
  LoraAdapters l16(b16, lo, 4), l32(b32, lo, 4);
  const auto noise = randn(l16.params().size(), 13, 0.3f);
  std::copy(noise.begin(), noise.end(), l16.params().data());
  std::copy(noise.begin(), noise.end(), l32.params().data());
  TrainBatch tb;
  tb.add_document({1, 299, 3, 140, 5, 6, 7});
  tb.add_document({9, 200, 7});
  CrossEntropyStrategy ce("seq", 0.0f);
  std::vector<std::vector<float>> grads;
  for (auto [model, lora] : {std::pair{&b16, &l16}, std::pair{&b32, &l32}}) {
    lora->refresh();
    model->set_adapters(lora->layer_adapters(), lo.rank);
    lora->zero_grads();
    ce.run(*model, tb, 1.0f);
    lora->finish_grads();
    grads.emplace_back(lora->grads().data(), lora->grads().data() + lora->grads().size());
  }
  double worst = 0, scale = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    worst = std::max(worst, std::fabs(double(grads[0][i]) - grads[1][i]));
    scale = std::max(scale, std::fabs(double(grads[1][i])));
  }
  EXPECT_GT(scale, 0.0);
  EXPECT_LT(worst, 1e-4 * scale);
  std::filesystem::remove_all(dir);
}

TEST(TrainModelTest, RecomputeGivesIdenticalGradients) {
  const auto config = model::ModelConfig::from_json(tiny_config(), "tiny");
  TrainModel a(config, false), b(config, true);
  a.init_weights(5);
  b.copy_parameters_from(a);
  TrainBatch tb;
  tb.add_document({1, 2, 3, 4, 5, 6});
  tb.add_document({9, 8, 7});
  CrossEntropyStrategy ce("seq", 0.1f);
  a.zero_grads();
  b.zero_grads();
  const double la = ce.run(a, tb, 1.0f).loss(), lb = ce.run(b, tb, 1.0f).loss();
  EXPECT_EQ(la, lb);
  for (size_t i = 0; i < a.grads().size(); ++i) ASSERT_EQ(a.grads().data()[i], b.grads().data()[i]);
}

// The trainer takes model::ModelConfig itself: the same configs are accepted and rejected.
TEST(TrainConfig, RejectsInvalidConfigs) {
  Json c = tiny_config();
  c["model_type"] = "gpt2";
  EXPECT_THROW(model::ModelConfig::from_json(c, "x"), Error);
  c = tiny_config();
  c["num_key_value_heads"] = 3;
  EXPECT_THROW(model::ModelConfig::from_json(c, "x"), Error);
}

// MLA, mlp_bias and dynamic scaling have parameters under the forward's names and shapes,
// and a saved checkpoint round-trips through the model layer (loadable by `astrai generate`).
TEST(TrainLiveWeights, MlaCheckpointRoundTrip) {
  Json j = mla_config();
  j["mlp_bias"] = true;
  j["rope_scaling"] = Json{{"type", "dynamic"}, {"factor", 2.0}};
  const auto config = model::ModelConfig::from_json(j, "mla");
  TrainModel m(config);
  m.init_weights(6);
  const auto dir = std::filesystem::temp_directory_path() / ("astrai_train_mla_" + std::to_string(::getpid()));
  save_hf_weights(dir.string(), m, config);
  auto ckpt = model::load_checkpoint(dir.string());
  EXPECT_TRUE(ckpt.config.is_mla());
  EXPECT_TRUE(ckpt.config.mlp_bias);
  EXPECT_EQ(ckpt.config.rope_scaling.type, model::RopeScalingType::kDynamic);
  TrainModel back(ckpt.config);
  back.load_weights(model::read_checkpoint_tensors(dir.string()).tensors, dir.string());
  for (size_t i = 0; i < m.params().size(); ++i) ASSERT_EQ(m.params().data()[i], back.params().data()[i]);
  std::filesystem::remove_all(dir);
}


// dpo_term's derivative against central differences, for every loss, and no overflow at
// large |h| (σ and log σ are evaluated on the stable side).
TEST(TrainDpo, TermDerivativeMatchesFiniteDifferences) {
  for (const DpoLoss loss : {DpoLoss::kSigmoid, DpoLoss::kIpo}) {
    for (const float eps : {0.0f, 0.2f}) {
      if (loss == DpoLoss::kIpo && eps != 0) continue;
      DpoOptions o;
      o.beta = 0.7f;
      o.loss = loss;
      o.label_smoothing = eps;
      for (const double h : {-3.0, -0.4, 0.0, 0.25, 2.5}) {
        const double step = 1e-6;
        const double fd = (dpo_term(h + step, o).loss - dpo_term(h - step, o).loss) / (2 * step);
        EXPECT_NEAR(dpo_term(h, o).dloss_dh, fd, 1e-7) << "loss " << static_cast<int>(loss) << " eps " << eps << " h " << h;
      }
    }
  }
  DpoOptions o;
  o.beta = 1.0f;
  EXPECT_NEAR(dpo_term(0.0, o).loss, std::log(2.0), 1e-15);
  EXPECT_NEAR(dpo_term(-1000.0, o).loss, 1000.0, 1e-9);  // −log σ(−1000) without overflow
  EXPECT_NEAR(dpo_term(1000.0, o).loss, 0.0, 1e-12);
  EXPECT_NEAR(dpo_term(-1000.0, o).dloss_dh, -1.0, 1e-12);
  EXPECT_THROW(parse_dpo_loss("hinge"), Error);
}

// A DPO batch of one pair whose rejected side equals the chosen side has h = 0 for any
// policy: the loss is log 2, the margin 0, and the gradients of the two sides cancel (up to
// the rounding of summing +x and −x in different orders).
TEST(TrainDpo, IdenticalSidesCancel) {
  const auto cfg = model::ModelConfig::from_json(tiny_config(), "tiny");
  TrainModel policy(cfg);
  policy.init_weights(3);
  TrainModel reference(cfg);
  reference.init_weights(4);
  DpoOptions o;
  DpoStrategy dpo(o, reference);
  TrainBatch b;
  const std::vector<int32_t> ids{1, 5, 7, 2, 9};
  const std::vector<uint8_t> mask{0, 0, 1, 1, 1};
  add_preference_pair(&b, ids, mask, ids, mask);
  policy.zero_grads();
  const MicroStats s = dpo.run(policy, b, 1.0f);
  EXPECT_EQ(s.num_targets, 1);
  EXPECT_NEAR(s.loss(), std::log(2.0), 1e-12);
  EXPECT_EQ(s.metric_sums[2], 0.0);
  float worst = 0.0f;
  for (size_t i = 0; i < policy.grads().size(); ++i) worst = std::max(worst, std::fabs(policy.grads().data()[i]));
  EXPECT_LT(worst, 1e-6f);
  // Not vacuous: a rejected side that differs moves the policy.
  TrainBatch other;
  add_preference_pair(&other, ids, mask, {1, 5, 7, 3, 4}, mask);
  policy.zero_grads();
  dpo.run(policy, other, 1.0f);
  worst = 0.0f;
  for (size_t i = 0; i < policy.grads().size(); ++i) worst = std::max(worst, std::fabs(policy.grads().data()[i]));
  EXPECT_GT(worst, 1e-4f);
}

TEST(TrainRewards, ExactMatchRegexCommand) {
  EXPECT_EQ(final_answer(" The answer is 42."), "42");
  EXPECT_EQ(final_answer("  cloud.\n"), "cloud");
  EXPECT_EQ(final_answer("(x)"), "x");
  EXPECT_EQ(final_answer(""), "");
  const auto em = make_reward("exact-match", 1.0);
  EXPECT_TRUE(em->needs_answer());
  EXPECT_EQ(em->score({"p", " so it is 4.0.", "4"}), 1.0);
  EXPECT_EQ(em->score({"p", " tiger.", " tiger\n"}), 1.0);
  EXPECT_EQ(em->score({"p", " tiger.", "lemon"}), 0.0);
  EXPECT_EQ(em->score({"p", "", "lemon"}), 0.0);
  const auto re = make_reward("regex:^ [a-z]+\\.$", 1.0);
  EXPECT_EQ(re->score({"p", " tiger.", ""}), 1.0);
  EXPECT_EQ(re->score({"p", " Tiger.", ""}), 0.0);
  EXPECT_THROW(make_reward("regex:(", 1.0), Error);
  EXPECT_THROW(make_reward("bleu", 1.0), Error);
  // The command sees the JSON record on stdin (here: counts its bytes) and prints a number.
  const auto cmd = make_reward("command:wc -c", 5.0);
  EXPECT_EQ(cmd->score({"a", "b", "c"}), 45.0);  // {"answer":"c","completion":"b","prompt":"a"}\n
  EXPECT_THROW(make_reward("command:exit 2", 5.0)->score({"a", "b", "c"}), Error);
  EXPECT_THROW(make_reward("command:echo nan", 5.0)->score({"a", "b", "c"}), Error);
  EXPECT_THROW(make_reward("command:sleep 3", 0.2)->score({"a", "b", "c"}), Error);
  // A child that never reads its (large) input and exits: no SIGPIPE death, a clear error.
  RewardInput big{"p", std::string(1 << 20, 'x'), ""};
  EXPECT_THROW(make_reward("command:exit 1", 5.0)->score(big), Error);
  EXPECT_EQ(make_reward("command:cat > /dev/null; echo 0.5", 5.0)->score(big), 0.5);
}

// Datasets reach the train type that reads them: HDF5 imports ("imported") and preprocessed
// text ("lm") train with seq/sft; preference pairs and prompts are clear errors there.
TEST(TrainBatchSource, DatasetKinds) {
  const auto root = std::filesystem::temp_directory_path() / ("astrai_batch_source_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  auto write = [&](const std::string& name, const char* kind) {
    data::ShardWriter w((root / name).string());
    w.add_key("sequence", DType::kI32, true);
    std::vector<int32_t> ids(100);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 50);
    w.add_record("sequence", ids);
    w.finish({{"kind", kind}});
    return (root / name).string();
  };
  auto imported = open_batch_source("seq", write("imported", "imported"), 8, 50);
  EXPECT_EQ(imported->size(), 12);
  TrainBatch b;
  imported->fill({0, 1}, &b);
  EXPECT_EQ(b.num_tokens(), 16);
  for (const auto& [kind, needle] : {std::pair{"preference", "--train-type dpo"}, std::pair{"prompt", "grpo"}}) {
    try {
      open_batch_source("sft", write(kind, kind), 8, 50);
      ADD_FAILURE() << kind << " data was accepted by sft";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(root);
}

// GRPO's policy versions: an engine on the trainer's live weights must not serve a prefix
// whose K/V were computed before an optimizer update. After the update and the version bump
// (what RolloutSource::after_update does), a repeated prompt hits no cache entry and its
// log-probabilities equal a fresh engine's on the updated weights; without the bump, the
// stale prefix is served and the log-probabilities differ (the check can fail).
TEST(TrainGrpo, StalePrefixNotServedAfterUpdate) {
  const auto config = model::ModelConfig::from_json(tiny_config(), "tiny");
  TrainModel m(config);
  m.init_weights(3, 0.2f);
  auto live = std::make_shared<const model::Transformer>(config, live_weights(m.weights(), config));
  infer::EngineOptions eo;
  eo.page_size = 8;
  eo.kv_cache_bytes = 4 << 20;
  infer::Engine bumped(infer::make_transformer_backend(live), nullptr, eo);
  infer::Engine stale(infer::make_transformer_backend(live), nullptr, eo);
  infer::GenerationRequest req;
  for (int i = 0; i < 37; ++i) req.prompt_ids.push_back((i * 7 + 3) % 50);
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 4;
  req.sampling.logprobs = 0;
  for (infer::Engine* e : {&bumped, &stale}) e->submit(req).wait();
  EXPECT_EQ(bumped.submit(req).wait().cached_prompt_tokens, 32) << "the prefix cache must work before the update";
  stale.submit(req).wait();

  // An optimizer update on the live buffer.
  const auto noise = randn(m.params().size(), 11, 0.05f);
  for (size_t i = 0; i < noise.size(); ++i) m.params().data()[i] += noise[i];
  bumped.invalidate_prefix_cache(1);

  std::vector<float> copy(m.params().data(), m.params().data() + m.params().size());
  TrainModel fresh_model(config);
  std::memcpy(fresh_model.params().data(), copy.data(), copy.size() * sizeof(float));
  auto fresh_view = std::make_shared<const model::Transformer>(config, live_weights(fresh_model.weights(), config));
  infer::Engine fresh(infer::make_transformer_backend(fresh_view), nullptr, eo);
  const auto want = fresh.submit(req).wait();
  const auto got = bumped.submit(req).wait();
  EXPECT_EQ(got.cached_prompt_tokens, 0);
  ASSERT_EQ(got.choices[0].token_ids, want.choices[0].token_ids);
  for (size_t t = 0; t < want.choices[0].logprobs.size(); ++t)
    EXPECT_EQ(got.choices[0].logprobs[t].logprob, want.choices[0].logprobs[t].logprob) << "token " << t;
  const auto old = stale.submit(req).wait();
  EXPECT_EQ(old.cached_prompt_tokens, 32);
  bool differs = old.choices[0].token_ids != want.choices[0].token_ids;
  for (size_t t = 0; !differs && t < want.choices[0].logprobs.size(); ++t)
    differs = old.choices[0].logprobs[t].logprob != want.choices[0].logprobs[t].logprob;
  EXPECT_TRUE(differs) << "a stale prefix should change the result (else this test proves nothing)";
}

}  // namespace
}  // namespace astrai::train
