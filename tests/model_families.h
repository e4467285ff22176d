// Small random-weight model families shared by the tests of several layers: the reference
// model's MLA with the attention gate on top of a llama config, and the three families the CUDA
// tests run on both backends (the forward in tests/model, training in tests/train): GQA llama,
// qwen3 with its qk-norm and an explicit head dim, and MLA.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "base/json.h"
#include "model/config.h"
#include "model/weights.h"

namespace astrai::testing_util {

// The llama config `j` as the reference autoregressive_lm with multi-head latent attention
// (kv_lora_rank 16, q/k 8 + 8 dims, v 12) and the sigmoid attention gate.
inline Json with_mla(Json j) {
  j["model_type"] = "autoregressive_lm";
  j["kv_lora_rank"] = 16;
  j["qk_nope_head_dim"] = 8;
  j["qk_rope_head_dim"] = 8;
  j["v_head_dim"] = 12;
  j["use_gated_attention"] = true;
  return j;
}

inline Json cuda_test_family(const std::string& kind) {
  Json j{{"model_type", "llama"},   {"vocab_size", 97},          {"hidden_size", 64},
         {"intermediate_size", 96}, {"num_hidden_layers", 2},    {"num_attention_heads", 8},
         {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-5},     {"max_position_embeddings", 128},
         {"tie_word_embeddings", false}};
  if (kind == "qwen3") {
    j["model_type"] = "qwen3";
    j["head_dim"] = 16;
  } else if (kind == "mla") {
    j = with_mla(j);
  }
  return j;
}

// Owned weights filled with N(0, 1/fan_in) (norms around 1), as the trainer would hold them;
// in `dtype` (rounded from the f32 values) when not f32.
inline model::ModelWeights random_weights(const model::ModelConfig& c, uint32_t seed, DType dtype = DType::kF32) {
  model::ModelWeights w = model::ModelWeights::allocate(c);
  std::mt19937 rng(seed);
  for (auto& p : w.params(c)) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    Tensor& t = *p.tensor;
    const bool vec = t.ndim() == 1;
    const float scale = vec ? 0.2f : 1.0f / std::sqrt(static_cast<float>(t.dim(-1)));
    const bool norm = p.name.find("norm") != std::string::npos;
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = (norm ? 1.0f : 0.0f) + scale * nd(rng);
    if (dtype != DType::kF32) t = t.to(dtype);
  }
  return w;
}

}  // namespace astrai::testing_util
