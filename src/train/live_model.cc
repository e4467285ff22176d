#include "train/live_model.h"

namespace astrai::train {

Arch arch_from_model_config(const model::ModelConfig& c) {
  ASTRAI_CHECK(!c.is_mla(), "training multi-head latent attention (kv_lora_rank > 0) is not supported yet");
  ASTRAI_CHECK(!c.mlp_bias, "training with mlp_bias is not supported");
  ASTRAI_CHECK(c.rope_scaling.type != model::RopeScalingType::kDynamic,
               "training with dynamic RoPE scaling is not supported (positions rescale per batch)");
  Arch a;
  a.model_type = c.model_type;
  a.vocab_size = c.vocab_size;
  a.hidden_size = c.hidden_size;
  a.num_layers = c.num_hidden_layers;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.intermediate_size = c.intermediate_size;
  a.norm_eps = static_cast<float>(c.rms_norm_eps);
  a.rope_theta = c.rope_theta;
  a.rope_pairing = c.rope_pairing == model::RopePairing::kAdjacent ? kernels::RopePairing::kInterleaved
                                                                  : kernels::RopePairing::kHalf;
  switch (c.rope_scaling.type) {
    case model::RopeScalingType::kLinear: a.rope_scaling.type = "linear"; break;
    case model::RopeScalingType::kLlama3: a.rope_scaling.type = "llama3"; break;
    default: a.rope_scaling.type = "default"; break;
  }
  a.rope_scaling.factor = c.rope_scaling.factor;
  a.rope_scaling.low_freq_factor = c.rope_scaling.low_freq_factor;
  a.rope_scaling.high_freq_factor = c.rope_scaling.high_freq_factor;
  a.rope_scaling.original_max_position = static_cast<double>(c.rope_scaling.original_max_position_embeddings);
  a.qkv_bias = c.qkv_bias;
  a.o_bias = c.o_bias;
  a.qk_norm = c.qk_norm;
  a.qk_norm_after_rope = c.qk_norm_after_rope;
  a.attn_gate = c.gated_attention;
  a.tie_embeddings = c.tie_word_embeddings;
  a.max_position = c.max_position_embeddings;
  a.validate();
  return a;
}

model::ModelWeights live_weights(const TrainModel& m, const model::ModelConfig& config) {
  const auto views = tensor_views(m.layout(), m.params());
  model::TensorMap map(views.begin(), views.end());
  return model::ModelWeights::from_tensors(config, map, "trainer parameters");
}

void save_hf_weights(const std::string& dir, const TrainModel& m, const model::ModelConfig& config) {
  model::save_checkpoint(dir, config, live_weights(m, config), DType::kF32);
}

}  // namespace astrai::train
