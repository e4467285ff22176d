#include "train/arch.h"

namespace astrai::train {

void Arch::validate() const {
  ASTRAI_CHECK(vocab_size > 0 && hidden_size > 0 && num_layers > 0 && num_heads > 0 &&
                   num_kv_heads > 0 && head_dim > 0 && intermediate_size > 0,
               "model config: sizes must be positive");
  ASTRAI_CHECK(num_heads % num_kv_heads == 0, "model config: num_attention_heads (", num_heads,
               ") must be a multiple of num_key_value_heads (", num_kv_heads, ")");
  ASTRAI_CHECK(head_dim % 2 == 0, "model config: head_dim must be even for RoPE");
}

Arch arch_from_hf_config(const Json& c, const std::string& where) {
  ASTRAI_CHECK(c.is_object(), where, ": config is not a JSON object");
  Arch a;
  a.model_type = json_optional<std::string>(c, "model_type", "llama", where);
  const auto& mt = a.model_type;
  ASTRAI_CHECK(mt == "llama" || mt == "mistral" || mt == "qwen2" || mt == "qwen3" ||
                   mt == "autoregressive_lm",
               where, ": model_type \"", mt,
               "\" is not trainable (llama, mistral, qwen2, qwen3, autoregressive_lm)");
  ASTRAI_CHECK(!c.contains("kv_lora_rank") || c["kv_lora_rank"].is_null(), where,
               ": multi-head latent attention (kv_lora_rank) is not supported by the trainer yet");
  a.vocab_size = json_required<int64_t>(c, "vocab_size", where);
  a.hidden_size = json_required<int64_t>(c, "hidden_size", where);
  a.num_layers = json_required<int64_t>(c, "num_hidden_layers", where);
  a.num_heads = json_required<int64_t>(c, "num_attention_heads", where);
  a.num_kv_heads = json_optional<int64_t>(c, "num_key_value_heads", a.num_heads, where);
  a.head_dim = json_optional<int64_t>(c, "head_dim", a.num_heads > 0 ? a.hidden_size / a.num_heads : 0, where);
  a.intermediate_size = json_required<int64_t>(c, "intermediate_size", where);
  a.norm_eps = static_cast<float>(json_optional<double>(c, "rms_norm_eps", 1e-6, where));
  a.rope_theta = json_optional<double>(c, "rope_theta", 10000.0, where);
  a.max_position = json_optional<int64_t>(c, "max_position_embeddings", 4096, where);
  a.tie_embeddings = json_optional<bool>(c, "tie_word_embeddings", false, where);
  const bool attention_bias = json_optional<bool>(c, "attention_bias", false, where);
  a.qkv_bias = mt == "qwen2" || attention_bias;
  a.o_bias = attention_bias && mt != "qwen2";
  const bool own = mt == "autoregressive_lm";
  if (own) {
    a.qk_norm = json_optional<bool>(c, "use_qk_norm", false, where);
    a.qk_norm_after_rope = true;
    a.attn_gate = json_optional<bool>(c, "use_gated_attention", false, where);
  } else {
    a.qk_norm = mt == "qwen3";
    ASTRAI_CHECK(!json_optional<bool>(c, "use_gated_attention", false, where) &&
                     !json_optional<bool>(c, "use_qk_norm", false, where),
                 where, ": use_gated_attention / use_qk_norm are only defined for autoregressive_lm");
  }
  ASTRAI_CHECK(!json_optional<bool>(c, "mlp_bias", false, where), where,
               ": mlp_bias is not supported by the trainer");
  const std::string pairing = json_optional<std::string>(c, "rope_pairing", own ? "adjacent" : "half", where);
  ASTRAI_CHECK(pairing == "half" || pairing == "adjacent", where,
               ": rope_pairing must be \"half\" or \"adjacent\"");
  a.rope_pairing = pairing == "adjacent" ? kernels::RopePairing::kInterleaved : kernels::RopePairing::kHalf;
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
    const Json& s = c["rope_scaling"];
    const std::string w = where + ": rope_scaling";
    auto& rs = a.rope_scaling;
    rs.type = json_optional<std::string>(s, "rope_type", json_optional<std::string>(s, "type", "default", w), w);
    ASTRAI_CHECK(rs.type == "default" || rs.type == "linear" || rs.type == "llama3" || rs.type == "yarn",
                 w, ": rope_type \"", rs.type, "\" is not supported (default, linear, llama3, yarn)");
    rs.factor = json_optional<double>(s, "factor", 1.0, w);
    rs.low_freq_factor = json_optional<double>(s, "low_freq_factor", 1.0, w);
    rs.high_freq_factor = json_optional<double>(s, "high_freq_factor", 4.0, w);
    rs.original_max_position = json_optional<double>(
        s, "original_max_position_embeddings", static_cast<double>(a.max_position), w);
    rs.beta_fast = json_optional<double>(s, "beta_fast", 32.0, w);
    rs.beta_slow = json_optional<double>(s, "beta_slow", 1.0, w);
    rs.attention_factor = json_optional<double>(s, "attention_factor", 0.0, w);
  }
  try {
    a.validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return a;
}

Json arch_to_hf_config(const Arch& a) {
  Json c;
  c["architectures"] = Json::array({a.model_type == "qwen3"   ? "Qwen3ForCausalLM"
                                    : a.model_type == "qwen2" ? "Qwen2ForCausalLM"
                                    : a.model_type == "mistral" ? "MistralForCausalLM"
                                                                : "LlamaForCausalLM"});
  c["model_type"] = a.model_type;
  c["vocab_size"] = a.vocab_size;
  c["hidden_size"] = a.hidden_size;
  c["num_hidden_layers"] = a.num_layers;
  c["num_attention_heads"] = a.num_heads;
  c["num_key_value_heads"] = a.num_kv_heads;
  c["head_dim"] = a.head_dim;
  c["intermediate_size"] = a.intermediate_size;
  c["rms_norm_eps"] = a.norm_eps;
  c["rope_theta"] = a.rope_theta;
  c["max_position_embeddings"] = a.max_position;
  c["tie_word_embeddings"] = a.tie_embeddings;
  c["hidden_act"] = "silu";
  c["torch_dtype"] = "float32";
  if (a.model_type != "qwen2") c["attention_bias"] = a.qkv_bias;
  const bool own = a.model_type == "autoregressive_lm";
  if (own) {
    c["use_qk_norm"] = a.qk_norm;
    c["use_gated_attention"] = a.attn_gate;
  }
  const bool adjacent = a.rope_pairing == kernels::RopePairing::kInterleaved;
  if (adjacent != own) c["rope_pairing"] = adjacent ? "adjacent" : "half";
  const auto& rs = a.rope_scaling;
  if (!rs.type.empty() && rs.type != "default") {
    Json s;
    s["rope_type"] = rs.type;
    s["factor"] = rs.factor;
    if (rs.type == "llama3") {
      s["low_freq_factor"] = rs.low_freq_factor;
      s["high_freq_factor"] = rs.high_freq_factor;
    }
    if (rs.type == "llama3" || rs.type == "yarn") s["original_max_position_embeddings"] = rs.original_max_position;
    if (rs.type == "yarn") {
      s["beta_fast"] = rs.beta_fast;
      s["beta_slow"] = rs.beta_slow;
      if (rs.attention_factor > 0) s["attention_factor"] = rs.attention_factor;
    }
    c["rope_scaling"] = s;
  }
  return c;
}

}  // namespace astrai::train
