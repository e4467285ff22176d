// The architecture the trainer builds, read from a Hugging Face config.json
// (llama, mistral, qwen2, qwen3, autoregressive_lm). It names exactly the features the
// training forward/backward implements; anything else is rejected with a clear error.
#pragma once

#include <cstdint>
#include <string>

#include "base/json.h"
#include "kernels/cpu/rope_backward.h"

namespace astrai::train {

struct Arch {
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  float norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  kernels::RopePairing rope_pairing = kernels::RopePairing::kHalf;
  kernels::RopeScaling rope_scaling;
  bool qkv_bias = false;        // qwen2, or attention_bias: true
  bool o_bias = false;          // attention_bias: true on llama also biases o_proj
  bool qk_norm = false;         // qwen3: RMSNorm over head_dim of q and k before RoPE
  bool qk_norm_after_rope = false;  // autoregressive_lm (reference AstrAI) order
  bool attn_gate = false;       // out = attn ∘ sigmoid(x·Wg^T) before o_proj
  bool tie_embeddings = false;  // lm_head shares embed_tokens
  int64_t max_position = 4096;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }

  // Checks the invariants the kernels assume (divisibility, positive sizes).
  void validate() const;
};

// Parses and validates; `where` names the source for messages.
Arch arch_from_hf_config(const Json& config, const std::string& where);
// The config.json written next to trained weights (round-trips through arch_from_hf_config).
Json arch_to_hf_config(const Arch& arch);

}  // namespace astrai::train
