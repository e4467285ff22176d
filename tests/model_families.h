// Small random-weight model families shared by the tests of several layers: the reference
// model's MLA with the attention gate on top of a llama config, and the three families the CUDA
// tests run on both backends (the forward in tests/model, training in tests/train): GQA llama,
// qwen3 with its qk-norm and an explicit head dim, and MLA.
#pragma once

#include <string>

#include "base/json.h"

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

}  // namespace astrai::testing_util
