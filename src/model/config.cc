#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "base/error.h"

namespace astrai::model {

namespace {

// The block dtype a weight format names; kF32 for "" and for names we do not know.
DType weight_format_dtype_or_f32(const std::string& format) {
  if (format == "q8_0") return DType::kQ8_0;
  if (format == "q4_0") return DType::kQ4_0;
  if (format == "q4_k") return DType::kQ4_K;
  if (format == "q5_k") return DType::kQ5_K;
  if (format == "q6_k") return DType::kQ6_K;
  return DType::kF32;
}

}  // namespace

namespace {

constexpr const char* kSupportedTypes = "llama, mistral, qwen2, qwen3, autoregressive_lm (alias transformer)";

// Reads an integer field that may be spelled two ways (Hugging Face name first, the
// reference AstrAI name second); both present with different values is a contradiction.
int64_t int_field(const Json& j, const char* hf, const char* alias, int64_t fallback, bool required,
                  const std::string& where) {
  const bool has_hf = j.contains(hf) && !j[hf].is_null();
  const bool has_alias = alias != nullptr && j.contains(alias) && !j[alias].is_null();
  if (!has_hf && !has_alias) {
    if (required) fail(where, ": missing required field \"", hf, "\"");
    return fallback;
  }
  const int64_t a = has_hf ? json_required<int64_t>(j, hf, where) : 0;
  const int64_t b = has_alias ? json_required<int64_t>(j, alias, where) : 0;
  if (has_hf && has_alias && a != b)
    fail(where, ": contradictory fields \"", hf, "\" = ", a, " and \"", alias, "\" = ", b);
  return has_hf ? a : b;
}

double double_field(const Json& j, const char* hf, const char* alias, double fallback, const std::string& where) {
  const bool has_hf = j.contains(hf) && !j[hf].is_null();
  const bool has_alias = alias != nullptr && j.contains(alias) && !j[alias].is_null();
  if (!has_hf && !has_alias) return fallback;
  const double a = has_hf ? json_required<double>(j, hf, where) : 0;
  const double b = has_alias ? json_required<double>(j, alias, where) : 0;
  if (has_hf && has_alias && a != b)
    fail(where, ": contradictory fields \"", hf, "\" = ", a, " and \"", alias, "\" = ", b);
  return has_hf ? a : b;
}

bool bool_field(const Json& j, const char* hf, const char* alias, bool fallback, const std::string& where) {
  const bool has_hf = j.contains(hf) && !j[hf].is_null();
  const bool has_alias = alias != nullptr && j.contains(alias) && !j[alias].is_null();
  if (!has_hf && !has_alias) return fallback;
  const bool a = has_hf ? json_required<bool>(j, hf, where) : false;
  const bool b = has_alias ? json_required<bool>(j, alias, where) : false;
  if (has_hf && has_alias && a != b)
    fail(where, ": contradictory fields \"", hf, "\" = ", a, " and \"", alias, "\" = ", b);
  return has_hf ? a : b;
}

// YaRN's optional fields, with Hugging Face's defaults (a missing, null or zero beta takes its
// default, as `get("beta_fast") or 32` does there).
void parse_yarn(const Json& r, const std::string& w, RopeScaling& rs) {
  auto number = [&](const char* name, double fallback) {
    const double v = json_optional<double>(r, name, 0.0, w);
    if (!std::isfinite(v) || v < 0) fail(w, ": ", name, " must be a non-negative number, got ", v);
    return v == 0.0 ? fallback : v;
  };
  rs.beta_fast = number("beta_fast", 32.0);
  rs.beta_slow = number("beta_slow", 1.0);
  if (!(rs.beta_fast > rs.beta_slow))
    fail(w, ": beta_fast (", rs.beta_fast, ") must be greater than beta_slow (", rs.beta_slow, ")");
  rs.truncate = json_optional<bool>(r, "truncate", true, w);
  const double m = number("mscale", 0.0), m_all = number("mscale_all_dim", 0.0);
  rs.attention_factor =
      m > 0 && m_all > 0 ? yarn_mscale(rs.factor, m) / yarn_mscale(rs.factor, m_all) : yarn_mscale(rs.factor);
  if (r.contains("attention_factor") && !r["attention_factor"].is_null()) {
    rs.attention_factor = json_required<double>(r, "attention_factor", w);
    if (!(rs.attention_factor > 0) || !std::isfinite(rs.attention_factor))
      fail(w, ": attention_factor must be a positive number, got ", rs.attention_factor);
  }
}

RopeScaling parse_rope_scaling(const Json& j, int64_t max_pos, const std::string& where) {
  RopeScaling rs;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return rs;
  const std::string w = where + ": rope_scaling";
  if (!it->is_object()) fail(w, " must be an object or null");
  const Json& r = *it;
  std::string type = json_optional<std::string>(r, "rope_type", "", w);
  const std::string type_old = json_optional<std::string>(r, "type", "", w);
  if (type.empty()) type = type_old;
  if (!type_old.empty() && type_old != type)
    fail(w, ": contradictory \"rope_type\" (", type, ") and \"type\" (", type_old, ")");
  if (type.empty()) fail(w, ": missing \"rope_type\"");
  if (type == "default") return rs;
  if (type == "freq_factors") {
    rs.type = RopeScalingType::kFreqFactors;
    auto f = r.find("freq_factors");
    if (f == r.end() || !f->is_array() || f->empty()) fail(w, ": freq_factors needs a non-empty \"freq_factors\" list");
    for (const auto& v : *f) {
      if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
        fail(w, ": freq_factors must be positive numbers");
      rs.freq_factors.push_back(v.get<double>());
    }
    return rs;
  }
  if (type == "linear") {
    rs.type = RopeScalingType::kLinear;
  } else if (type == "dynamic") {
    rs.type = RopeScalingType::kDynamic;
  } else if (type == "llama3") {
    rs.type = RopeScalingType::kLlama3;
  } else if (type == "yarn") {
    rs.type = RopeScalingType::kYarn;
  } else {
    fail(w, ": unsupported rope_type \"", type, "\" (supported: default, linear, dynamic, llama3, yarn, freq_factors)");
  }
  rs.factor = json_required<double>(r, "factor", w);
  if (!(rs.factor >= 1.0) || !std::isfinite(rs.factor)) fail(w, ": factor must be >= 1, got ", rs.factor);
  rs.original_max_position_embeddings = json_optional<int64_t>(r, "original_max_position_embeddings", max_pos, w);
  if (rs.type == RopeScalingType::kLlama3) {
    rs.low_freq_factor = json_required<double>(r, "low_freq_factor", w);
    rs.high_freq_factor = json_required<double>(r, "high_freq_factor", w);
    if (!(rs.high_freq_factor > rs.low_freq_factor) || !(rs.low_freq_factor > 0))
      fail(w, ": need 0 < low_freq_factor < high_freq_factor");
    if (!r.contains("original_max_position_embeddings"))
      fail(w, ": llama3 needs \"original_max_position_embeddings\"");
  }
  if (rs.type == RopeScalingType::kYarn) parse_yarn(r, w, rs);
  if ((rs.type == RopeScalingType::kDynamic || rs.type == RopeScalingType::kLlama3 || rs.type == RopeScalingType::kYarn) &&
      rs.original_max_position_embeddings <= 0)
    fail(w, ": needs a positive original_max_position_embeddings or max_position_embeddings");
  return rs;
}

}  // namespace

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

int64_t ModelConfig::context_length() const {
  if (rope_scaling.type != RopeScalingType::kYarn) return max_position_embeddings;
  const double extended = static_cast<double>(rope_scaling.original_max_position_embeddings) * rope_scaling.factor;
  return std::max<int64_t>(max_position_embeddings, static_cast<int64_t>(std::min(extended, 1e15)));
}

const char* rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone: return "none";
    case RopeScalingType::kLinear: return "linear";
    case RopeScalingType::kDynamic: return "dynamic";
    case RopeScalingType::kLlama3: return "llama3";
    case RopeScalingType::kFreqFactors: return "freq_factors";
    case RopeScalingType::kYarn: return "yarn";
  }
  return "?";
}

ModelConfig ModelConfig::from_json(const Json& j, const std::string& where) {
  if (!j.is_object()) fail(where, ": expected a JSON object");
  ModelConfig c;
  c.model_type = json_required<std::string>(j, "model_type", where);
  const std::string& t = c.model_type;
  const bool own = t == "autoregressive_lm" || t == "transformer";
  if (t == "transformer") c.model_type = "autoregressive_lm";
  if (!own && t != "llama" && t != "mistral" && t != "qwen2" && t != "qwen3")
    fail(where, ": unknown model_type \"", t, "\" (supported: ", kSupportedTypes, ")");
  // The reference spells some fields differently; only its own model type accepts them.
  auto alias = [&](const char* name) { return own ? name : nullptr; };

  c.vocab_size = int_field(j, "vocab_size", nullptr, 0, true, where);
  c.hidden_size = int_field(j, "hidden_size", alias("dim"), 0, true, where);
  c.intermediate_size = int_field(j, "intermediate_size", alias("dim_ffn"), 0, true, where);
  c.num_hidden_layers = int_field(j, "num_hidden_layers", alias("n_layers"), 0, true, where);
  c.num_attention_heads = int_field(j, "num_attention_heads", alias("n_heads"), 0, true, where);
  c.num_key_value_heads = int_field(j, "num_key_value_heads", alias("n_kv_heads"), c.num_attention_heads, false, where);
  c.max_position_embeddings = int_field(j, "max_position_embeddings", alias("max_len"), 2048, false, where);
  c.rms_norm_eps = double_field(j, "rms_norm_eps", alias("norm_eps"), 1e-6, where);
  c.rope_theta = double_field(j, "rope_theta", nullptr, 10000.0, where);
  c.tie_word_embeddings = bool_field(j, "tie_word_embeddings", alias("tie_weight"), false, where);

  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const Json& q = j["quantization_config"];
    const std::string method = q.is_object() ? json_optional<std::string>(q, "quant_method", "", where) : "";
    c.weight_format = method == "astrai" ? json_optional<std::string>(q, "format", "", where) : "";
    if (method != "astrai" || c.weight_format.empty() || !is_block_type(weight_format_dtype_or_f32(c.weight_format)))
      fail(where, ": unsupported quantization_config ", q.dump(),
           " (supported: {\"quant_method\": \"astrai\", \"format\": \"q8_0\", \"q4_0\", \"q4_k\", \"q5_k\" or \"q6_k\"}, written by astrai quantize)");
    if (q.contains("tensor_formats")) {
      const Json& tf = q["tensor_formats"];
      if (!tf.is_object()) fail(where, ": quantization_config.tensor_formats must be an object {tensor name: format}");
      for (auto it = tf.begin(); it != tf.end(); ++it) {
        const std::string f = it.value().is_string() ? it.value().get<std::string>() : "";
        if (f != "f32" && !is_block_type(weight_format_dtype_or_f32(f)))
          fail(where, ": quantization_config.tensor_formats[\"", it.key(), "\"] is ", it.value().dump(),
               " (supported: \"q8_0\", \"q4_0\", \"q4_k\", \"q5_k\", \"q6_k\", \"f32\")");
        c.tensor_formats[it.key()] = f;
      }
    }
  }

  const std::string act = json_optional<std::string>(j, "hidden_act", "silu", where);
  if (act != "silu" && act != "swish") fail(where, ": unsupported hidden_act \"", act, "\" (only silu)");

  if (c.num_attention_heads <= 0) fail(where, ": num_attention_heads must be positive");
  const bool has_head_dim = j.contains("head_dim") && !j["head_dim"].is_null();
  if (has_head_dim) {
    c.head_dim = json_required<int64_t>(j, "head_dim", where);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      fail(where, ": hidden_size ", c.hidden_size, " is not divisible by num_attention_heads ",
           c.num_attention_heads, " and no head_dim is given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  const bool attention_bias = bool_field(j, "attention_bias", nullptr, false, where);
  c.mlp_bias = bool_field(j, "mlp_bias", nullptr, false, where);
  if (t == "qwen2") {
    c.qkv_bias = true;  // Qwen2 always has q/k/v bias and no o_proj bias
    if (bool_field(j, "use_sliding_window", nullptr, false, where))
      fail(where, ": use_sliding_window is not supported for qwen2");
  } else {
    c.qkv_bias = attention_bias;
    c.o_bias = attention_bias;
  }
  if (t == "qwen3") {
    c.qk_norm = true;
    c.qk_norm_after_rope = false;
    if (bool_field(j, "use_sliding_window", nullptr, false, where))
      fail(where, ": use_sliding_window is not supported for qwen3");
  }
  c.rope_scaling = parse_rope_scaling(j, c.max_position_embeddings, where);
  if (t == "mistral" && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    const int64_t w = json_required<int64_t>(j, "sliding_window", where);
    // Sliding-window attention is not implemented; positions below the window behave
    // exactly like full attention, so we accept the field and cap the context instead.
    if (w > 0 && w < c.max_position_embeddings) c.max_position_embeddings = w;
  }
  c.rope_pairing = own ? RopePairing::kAdjacent : RopePairing::kHalf;
  if (j.contains("rope_pairing") && !j["rope_pairing"].is_null()) {
    const std::string p = json_required<std::string>(j, "rope_pairing", where);
    if (p == "half") {
      c.rope_pairing = RopePairing::kHalf;
    } else if (p == "adjacent") {
      c.rope_pairing = RopePairing::kAdjacent;
    } else {
      fail(where, ": rope_pairing must be \"half\" or \"adjacent\", got \"", p, "\"");
    }
  }

  if (own) {
    c.qk_norm = bool_field(j, "use_qk_norm", nullptr, false, where);
    c.qk_norm_after_rope = true;
    c.gated_attention = bool_field(j, "use_gated_attention", nullptr, false, where);
    c.kv_lora_rank = int_field(j, "kv_lora_rank", nullptr, 0, false, where);
    if (c.kv_lora_rank > 0) {
      c.attention = AttentionKind::kMla;
      c.qk_nope_head_dim = int_field(j, "qk_nope_head_dim", nullptr, 0, true, where);
      c.qk_rope_head_dim = int_field(j, "qk_rope_head_dim", nullptr, 0, true, where);
      // The reference gives v the width of the non-rotated part of k.
      c.v_head_dim = int_field(j, "v_head_dim", nullptr, c.qk_nope_head_dim, false, where);
      if (has_head_dim && c.head_dim != c.qk_nope_head_dim + c.qk_rope_head_dim)
        fail(where, ": contradictory head_dim ", c.head_dim, " for MLA (qk_nope_head_dim + qk_rope_head_dim = ",
             c.qk_nope_head_dim + c.qk_rope_head_dim, ")");
      c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
    } else {
      for (const char* f : {"qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
        if (j.contains(f) && !j[f].is_null())
          fail(where, ": field \"", f, "\" needs kv_lora_rank > 0 (MLA)");
    }
  } else {
    for (const char* f : {"kv_lora_rank", "use_gated_attention", "use_qk_norm"})
      if (j.contains(f) && !j[f].is_null() && !(j[f].is_boolean() && !j[f].get<bool>()) &&
          !(j[f].is_number() && j[f].get<double>() == 0))
        fail(where, ": field \"", f, "\" is not supported for model_type ", t);
  }

  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int32_t>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer()) fail(where, ": eos_token_id must hold integers");
        c.eos_token_ids.push_back(e.get<int32_t>());
      }
    } else {
      fail(where, ": eos_token_id must be an integer or a list");
    }
  }
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_integer()) c.bos_token_id = it->get<int32_t>();

  c.validate(where);
  return c;
}

void ModelConfig::validate(const std::string& where) const {
  auto positive = [&](int64_t v, const char* name) {
    if (v <= 0) fail(where, ": ", name, " must be positive, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  if (vocab_size > INT32_MAX) fail(where, ": vocab_size ", vocab_size, " does not fit 32-bit token ids");
  if (num_attention_heads % num_key_value_heads != 0)
    fail(where, ": num_attention_heads ", num_attention_heads, " is not a multiple of num_key_value_heads ",
         num_key_value_heads);
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) fail(where, ": rms_norm_eps must be positive");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) fail(where, ": rope_theta must be positive");
  if (is_mla()) {
    positive(kv_lora_rank, "kv_lora_rank");
    positive(qk_nope_head_dim, "qk_nope_head_dim");
    positive(qk_rope_head_dim, "qk_rope_head_dim");
    positive(v_head_dim, "v_head_dim");
    if (qk_rope_head_dim % 2 != 0) fail(where, ": qk_rope_head_dim must be even, got ", qk_rope_head_dim);
    if (qk_norm) fail(where, ": use_qk_norm is not defined for MLA attention (kv_lora_rank > 0)");
  } else if (head_dim % 2 != 0) {
    fail(where, ": head_dim must be even for RoPE, got ", head_dim);
  }
  if (rope_scaling.type == RopeScalingType::kFreqFactors &&
      static_cast<int64_t>(rope_scaling.freq_factors.size()) != rope_dim() / 2)
    fail(where, ": ", rope_scaling.freq_factors.size(), " RoPE freq_factors for ", rope_dim() / 2, " rotated pairs");
  if (rope_scaling.type == RopeScalingType::kDynamic && rope_dim() <= 2)
    fail(where, ": dynamic rope scaling needs a rotary dimension > 2");
}

ModelConfig ModelConfig::load(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return from_json(read_json_file(path), path);
}

DType ModelConfig::weight_format_dtype(const std::string& format) {
  const DType t = weight_format_dtype_or_f32(format);
  if (!format.empty() && t == DType::kF32) fail("unknown weight format \"", format, "\" (supported: q8_0, q4_0, q4_k, q5_k, q6_k)");
  return t;
}

DType ModelConfig::tensor_dtype(const std::string& name) const {
  const auto it = tensor_formats.find(name);
  return it == tensor_formats.end() ? weight_dtype() : weight_format_dtype_or_f32(it->second);
}

namespace {
// The Hugging Face class of a family, what transformers and llama.cpp's converter pick the model by
// (none for the reference project's own autoregressive_lm, which transformers has no class for).
Json hf_architectures(const std::string& model_type) {
  if (model_type == "llama") return Json::array({"LlamaForCausalLM"});
  if (model_type == "mistral") return Json::array({"MistralForCausalLM"});
  if (model_type == "qwen2") return Json::array({"Qwen2ForCausalLM"});
  if (model_type == "qwen3") return Json::array({"Qwen3ForCausalLM"});
  return Json::array();
}
}  // namespace

Json ModelConfig::to_json() const {
  Json j;
  j["model_type"] = model_type;
  j["architectures"] = hf_architectures(model_type);
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (!weight_format.empty()) {
    j["quantization_config"] = {{"quant_method", "astrai"}, {"format", weight_format}};
    if (!tensor_formats.empty()) j["quantization_config"]["tensor_formats"] = tensor_formats;
  }
  const bool own = model_type == "autoregressive_lm";
  if (model_type != "qwen2") j["attention_bias"] = qkv_bias;
  if (model_type == "llama" || own) j["mlp_bias"] = mlp_bias;
  if (own) {
    j["use_qk_norm"] = qk_norm;
    j["use_gated_attention"] = gated_attention;
    if (is_mla()) {
      j["kv_lora_rank"] = kv_lora_rank;
      j["qk_nope_head_dim"] = qk_nope_head_dim;
      j["qk_rope_head_dim"] = qk_rope_head_dim;
      j["v_head_dim"] = v_head_dim;
      j.erase("head_dim");
    }
  }
  const RopePairing family_pairing = own ? RopePairing::kAdjacent : RopePairing::kHalf;
  if (rope_pairing != family_pairing) j["rope_pairing"] = rope_pairing == RopePairing::kHalf ? "half" : "adjacent";
  if (rope_scaling.type == RopeScalingType::kNone) {
    j["rope_scaling"] = nullptr;
  } else {
    Json r;
    r["rope_type"] = rope_scaling_name(rope_scaling.type);
    if (rope_scaling.type == RopeScalingType::kFreqFactors) r["freq_factors"] = rope_scaling.freq_factors;
    else r["factor"] = rope_scaling.factor;
    if (rope_scaling.type == RopeScalingType::kLlama3) {
      r["low_freq_factor"] = rope_scaling.low_freq_factor;
      r["high_freq_factor"] = rope_scaling.high_freq_factor;
    }
    if (rope_scaling.type == RopeScalingType::kYarn) {
      r["beta_fast"] = rope_scaling.beta_fast;
      r["beta_slow"] = rope_scaling.beta_slow;
      r["truncate"] = rope_scaling.truncate;
      r["attention_factor"] = rope_scaling.attention_factor;
    }
    if (rope_scaling.original_max_position_embeddings > 0)
      r["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    j["rope_scaling"] = r;
  }
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  return j;
}

std::string ModelConfig::summary() const {
  std::ostringstream o;
  o << model_type << ": " << num_hidden_layers << " layers, hidden " << hidden_size << ", ffn " << intermediate_size
    << ", vocab " << vocab_size << ", ";
  if (is_mla()) {
    o << "MLA heads " << num_attention_heads << "/" << num_key_value_heads << " (rank " << kv_lora_rank << ", qk "
      << qk_nope_head_dim << "+" << qk_rope_head_dim << ", v " << v_head_dim << ")";
  } else {
    const char* kind = num_key_value_heads == num_attention_heads ? "MHA"
                       : num_key_value_heads == 1                 ? "MQA"
                                                                  : "GQA";
    o << kind << " heads " << num_attention_heads << "/" << num_key_value_heads << " x " << head_dim;
  }
  o << ", RoPE " << (rope_pairing == RopePairing::kHalf ? "half" : "adjacent") << " theta " << rope_theta;
  if (rope_scaling.type != RopeScalingType::kNone)
    o << " (" << rope_scaling_name(rope_scaling.type) << " x" << rope_scaling.factor << ")";
  if (qkv_bias) o << ", qkv bias";
  if (qk_norm) o << ", qk-norm" << (qk_norm_after_rope ? " after RoPE" : "");
  if (gated_attention) o << ", gated attention";
  o << (tie_word_embeddings ? ", tied embeddings" : ", untied embeddings");
  if (!weight_format.empty()) o << ", " << weight_format << " weights";
  for (const auto& [name, f] : tensor_formats) o << " (" << name << " " << f << ")";
  return o.str();
}

}  // namespace astrai::model
