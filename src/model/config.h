// ModelConfig: the architecture of a decoder-only transformer, read from a Hugging Face
// `config.json`. One struct covers every supported family; the loader fills the family
// defaults (bias, qk-norm placement, RoPE pairing) so the forward pass only reads flags.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/json.h"
#include "tensor/dtype.h"
#include "kernels/rope_pairing.h"

namespace astrai::model {

// How RoPE pairs the dimensions it rotates (kernels/rope_pairing.h: one type for config and kernels).
using kernels::RopePairing;

// kFreqFactors: each rotated pair's frequency divided by its own factor (llama.cpp's rope_freqs
// tensor, how GGUF files carry llama3 scaling): {"rope_type": "freq_factors", "freq_factors": [...]}.
// kYarn: YaRN (Peng et al. 2023) as Hugging Face computes it: each pair's frequency blends the
// original and the factor-interpolated one by a linear ramp over the pairs between the beta_fast
// and beta_slow correction dimensions, and cos/sin are multiplied by the attention factor.
enum class RopeScalingType { kNone, kLinear, kDynamic, kLlama3, kFreqFactors, kYarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  std::vector<double> freq_factors;  // kFreqFactors: one per rotated pair (rope_dim / 2)
  // llama3: the context the frequencies were trained for and the band edges.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // yarn: the ramp's ends in rotations, whether they are rounded out to whole pairs, and the
  // attention factor (given, or from mscale / mscale_all_dim, or 0.1 ln(factor) + 1).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 1.0;
};

// YaRN's attention temperature for a context extended by `factor`: 0.1 m ln(factor) + 1, or 1
// when factor <= 1 (m = 1 unless a config scales it: mscale, mscale_all_dim).
double yarn_mscale(double factor, double m = 1.0);

enum class AttentionKind { kGqa, kMla };

struct ModelConfig {
  std::string model_type;  // llama, mistral, qwen2, qwen3, autoregressive_lm
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // GQA head width (q, k and v)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopePairing rope_pairing = RopePairing::kHalf;
  bool tie_word_embeddings = false;

  bool qkv_bias = false;  // q/k/v projections carry a bias (qwen2, llama attention_bias)
  bool o_bias = false;    // o_proj carries a bias (llama attention_bias)
  bool mlp_bias = false;  // gate/up/down carry biases (llama mlp_bias)
  bool qk_norm = false;   // RMSNorm over head_dim on q and k (qwen3, autoregressive_lm use_qk_norm)
  bool qk_norm_after_rope = false;  // reference AstrAI order; qwen3 normalises before RoPE
  bool gated_attention = false;     // attn_out * sigmoid(gate(x)) before o_proj

  AttentionKind attention = AttentionKind::kGqa;
  // MLA (autoregressive_lm with kv_lora_rank > 0).
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // Weights quantized by `astrai quantize` (config.json "quantization_config": {"quant_method":
  // "astrai", "format": "q8_0" | "q4_0" | "q4_k" | "q5_k" | "q6_k"}): the matrices are stored
  // as Q8_0, Q4_0, Q4_K, Q5_K or Q6_K blocks (docs/quantization.md); empty for float checkpoints.
  std::string weight_format;
  // Matrices stored in another format than weight_format, by parameter name ("tensor_formats":
  // {"model.embed_tokens.weight": "q8_0"} in quantization_config; astrai quantize
  // --embedding-type): a block format, or "f32" for a matrix kept as F32.
  std::map<std::string, std::string> tensor_formats;
  // The dtype of the matrices of a quantized checkpoint (kQ8_0, kQ4_0, kQ4_K, kQ5_K, kQ6_K), kF32 for a float one.
  DType weight_dtype() const { return weight_format_dtype(weight_format); }
  // The dtype parameter `name` is stored in when it is a matrix: its tensor_formats entry, else weight_dtype().
  DType tensor_dtype(const std::string& name) const;
  // "q8_0" -> kQ8_0, "q4_0" -> kQ4_0, "q4_k" -> kQ4_K, "q5_k" -> kQ5_K, "q6_k" -> kQ6_K, "" -> kF32; an error
  // naming the supported formats otherwise.
  static DType weight_format_dtype(const std::string& format);

  std::vector<int32_t> eos_token_ids;  // may be empty
  int32_t bos_token_id = -1;           // -1 when absent

  bool is_mla() const { return attention == AttentionKind::kMla; }
  // Widths of one head of q/k (what the dot product runs over) and of v.
  int64_t qk_head_dim() const { return is_mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
  int64_t v_dim() const { return is_mla() ? v_head_dim : head_dim; }
  // Dimensions of each q/k head that RoPE rotates: the trailing qk_rope_head_dim for MLA,
  // the whole head otherwise.
  int64_t rope_dim() const { return is_mla() ? qk_rope_head_dim : head_dim; }
  // The longest context the engine serves: max_position_embeddings, or with YaRN the context it
  // extends to, original_max_position_embeddings x factor, when larger (as vLLM takes it).
  int64_t context_length() const;
  int64_t kv_groups() const { return num_attention_heads / num_key_value_heads; }

  // Parses and validates; `where` names the file in error messages.
  static ModelConfig from_json(const Json& j, const std::string& where = "config.json");
  // Reads DIR/config.json.
  static ModelConfig load(const std::string& dir);
  // Hugging Face field names; from_json(to_json()) gives back the same config.
  Json to_json() const;
  // Throws astrai::Error if the fields contradict each other.
  void validate(const std::string& where) const;
  // One line: "llama: 12 layers, hidden 768, heads 12/4 x 64, ..."
  std::string summary() const;
};

const char* rope_scaling_name(RopeScalingType t);

}  // namespace astrai::model
